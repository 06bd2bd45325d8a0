"""Fused kernels: softmax cross-entropy, layer/batch norm, the LSTM cell, SGD/Adam updates.

Three layers are checked against oracles that do not share their code:

* the device kernels (``protocol.py``'s fused section) called directly on every device module
  that has them — numpy, compiled C++, CUDA where enabled — against float64 formulas written
  here, backward kernels against central differences of those formulas;
* the array-level functions (``array_api.softmax_xent`` ..., NDArray and numpy versions);
* the fused ops and modules against the unfused composition of the course's ops (values and
  gradients) and against finite differences, on every enabled device.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES
from helpers import central_difference, check_gradients, float32_tensor

import needle as ndl
import needle.fast as fast
from needle import backend_ndarray as nd
from needle import backend_numpy as npf
from needle import nn, ops
from needle.fast import ops as ops_fused

pytestmark = [pytest.mark.nn, pytest.mark.both_backends]

F32 = np.float32


# ---- float64 oracles ----------------------------------------------------------------------------
def xent64(z, y):
    z = z.astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z - m).sum(axis=1)) + m[:, 0]
    return lse - z[np.arange(len(y)), y], np.exp(z - lse[:, None])


def norm64(x, w, b, eps, axis):
    x = x.astype(np.float64)
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    xhat = (x - mean) / np.sqrt(var + eps)
    return xhat * w + b, xhat, 1 / np.sqrt(var + eps), mean, var


def sig64(x):
    return 1 / (1 + np.exp(-x))


def lstm64(gates, c_prev):
    H = c_prev.shape[1]
    g = gates.astype(np.float64)
    i, f, gg, o = (
        sig64(g[:, :H]),
        sig64(g[:, H : 2 * H]),
        np.tanh(g[:, 2 * H : 3 * H]),
        sig64(g[:, 3 * H :]),
    )
    c = f * c_prev + i * gg
    return o * np.tanh(c), c, np.concatenate([i, f, gg, o], axis=1), np.tanh(c)


def vjp(f, x, cotangent):
    """Σ f(x)·cotangent differentiated by central differences in float64."""
    return central_difference(lambda v: float((f(v) * cotangent).sum()), x)


# ---- the device kernels, on every module that has them ------------------------------------------
def _modules():
    params = []
    for name, dev in (("cpu_numpy", nd.cpu_numpy()), ("cpu", nd.cpu()), ("cuda", nd.cuda())):
        marks = []
        if not dev.enabled():
            marks = [pytest.mark.skip(reason=f"{name}() is not enabled here")]
        params.append(pytest.param(dev, id=name, marks=marks))
    return params


MODULES = _modules()


def _buf(mod, a):
    a = np.ascontiguousarray(a, dtype=F32)
    buf = mod.Array(a.size)
    if a.size:
        mod.from_numpy(a.reshape(-1), buf)
    return buf


def _read(mod, buf, shape):
    n = int(np.prod(shape))
    return mod.to_numpy(buf, (n,), (1,), 0).reshape(shape) if n else np.zeros(shape, F32)


def _kernel(dev, name):
    """The device module's kernel ``name``; the module must implement every fused kernel."""
    mod = dev.mod
    assert hasattr(mod, name), f"device module {dev} lacks the fused kernel {name}"
    return mod, getattr(mod, name)


@pytest.mark.parametrize("dev", MODULES)
@pytest.mark.parametrize("rows, cols", [(1, 1), (4, 7), (33, 130), (300, 1000)])  # last: threaded
def test_kernel_softmax_xent(dev, rows, cols):
    mod, kernel = _kernel(dev, "softmax_xent")
    rng = np.random.default_rng(rows * cols)
    z = (rng.standard_normal((rows, cols)) * 3).astype(F32)
    y = rng.integers(0, cols, rows)
    loss, probs = mod.Array(rows), mod.Array(rows * cols)
    kernel(_buf(mod, z), _buf(mod, y), rows, cols, loss, probs)
    want_loss, want_probs = xent64(z, y)
    np.testing.assert_allclose(_read(mod, loss, (rows,)), want_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_read(mod, probs, (rows, cols)), want_probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dev", MODULES)
def test_kernel_softmax_xent_special_values(dev):
    mod, kernel = _kernel(dev, "softmax_xent")
    # a non-target -inf contributes nothing; huge logits do not overflow
    z = np.array([[-np.inf, 0, 1], [1e30, 0, -1e30], [3e4, 3e4, 0]], F32)
    y = np.array([1, 0, 1])
    loss, probs = mod.Array(3), mod.Array(9)
    kernel(_buf(mod, z), _buf(mod, y), 3, 3, loss, probs)
    # hand-derived: log(1 + e) - 0 = 1.3133, 0, log 2
    np.testing.assert_allclose(
        _read(mod, loss, (3,)), [np.log1p(np.e), 0.0, np.log(2)], rtol=1e-5, atol=1e-6
    )
    p = _read(mod, probs, (3, 3))
    np.testing.assert_allclose(p[0], [0, 1 / (1 + np.e), np.e / (1 + np.e)], rtol=1e-5)
    np.testing.assert_allclose(p[2], [0.5, 0.5, 0], atol=1e-6)


@pytest.mark.parametrize("dev", MODULES)
def test_kernel_softmax_xent_rejects_bad_labels_and_sizes(dev):
    mod, kernel = _kernel(dev, "softmax_xent")
    z = _buf(mod, np.zeros((2, 3)))
    with pytest.raises(ValueError):
        kernel(z, _buf(mod, [0, 3]), 2, 3, mod.Array(2), mod.Array(6))
    with pytest.raises(ValueError):
        kernel(z, _buf(mod, [0, -1]), 2, 3, mod.Array(2), mod.Array(6))
    with pytest.raises(ValueError):  # probs too small
        kernel(z, _buf(mod, [0, 1]), 2, 3, mod.Array(2), mod.Array(5))
    with pytest.raises(ValueError):  # logits too small for rows × cols
        kernel(z, _buf(mod, [0, 1, 2]), 3, 3, mod.Array(3), mod.Array(9))


def xent_grad64(probs, labels, dloss, scale):
    """(probs - one_hot(labels)) * dloss[:, None] * scale in float64 (dloss (N,) or ())."""
    one_hot = np.eye(probs.shape[1])[np.asarray(labels, int)]
    return (probs.astype(np.float64) - one_hot) * (np.reshape(dloss, (-1, 1)) * scale)


@pytest.mark.parametrize("dev", MODULES)
@pytest.mark.parametrize("rows, cols", [(1, 1), (4, 7), (300, 1000)])  # last: threaded
@pytest.mark.parametrize("shared", [False, True])
def test_kernel_softmax_xent_bwd_fresh_and_over_its_probabilities(dev, rows, cols, shared):
    mod, kernel = _kernel(dev, "softmax_xent_bwd")
    rng = np.random.default_rng(rows + cols)
    probs = rng.random((rows, cols)).astype(F32)
    y = rng.integers(0, cols, rows)
    dloss = np.array([0.75], F32) if shared else rng.standard_normal(rows).astype(F32)
    want = xent_grad64(probs, y, dloss, 0.5)
    pb, yb, db = _buf(mod, probs), _buf(mod, y), _buf(mod, dloss)
    out = mod.Array(rows * cols)
    kernel(pb, yb, db, rows, cols, 0.5, out)
    fresh = _read(mod, out, (rows, cols))
    np.testing.assert_allclose(fresh, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(_read(mod, pb, (rows, cols)), probs)  # read only
    kernel(pb, yb, db, rows, cols, 0.5, pb)  # dlogits is probs' own buffer
    np.testing.assert_array_equal(_read(mod, pb, (rows, cols)), fresh)


@pytest.mark.parametrize("dev", MODULES)
def test_kernel_softmax_xent_bwd_rejects_bad_labels_before_writing(dev):
    mod, kernel = _kernel(dev, "softmax_xent_bwd")
    probs = np.full((2, 3), 0.25, F32)
    for labels in ([0, 3], [0, -1], [0.5, 1]):
        pb = _buf(mod, probs)
        with pytest.raises(ValueError, match="softmax_xent_bwd: label"):
            kernel(pb, _buf(mod, labels), _buf(mod, [1.0, 1.0]), 2, 3, 1.0, pb)
        np.testing.assert_array_equal(_read(mod, pb, (2, 3)), probs)  # nothing written
    pb, yb = _buf(mod, probs), _buf(mod, [0, 1])
    with pytest.raises(ValueError, match="dloss"):  # neither rows elements nor one
        kernel(pb, yb, _buf(mod, [1.0, 1.0, 1.0]), 2, 3, 1.0, mod.Array(6))
    with pytest.raises(ValueError, match="dlogits"):
        kernel(pb, yb, _buf(mod, [1.0]), 2, 3, 1.0, mod.Array(5))


@pytest.mark.parametrize("dev", MODULES)
@pytest.mark.parametrize("kind", ["layernorm", "batchnorm"])
@pytest.mark.parametrize("rows, cols", [(1, 5), (6, 1), (9, 17)])
def test_kernel_norm_forward_and_backward(dev, kind, rows, cols):
    if kind == "batchnorm" and rows == 1 and cols == 5:
        rows = 2  # one row has zero variance: still defined, but keep the test informative
    mod, fwd = _kernel(dev, f"{kind}_fwd")
    _, bwd = _kernel(dev, f"{kind}_bwd")
    axis = 1 if kind == "layernorm" else 0
    rng = np.random.default_rng(rows + 10 * cols)
    x = (rng.standard_normal((rows, cols)) * 2 + 1).astype(F32)
    w = rng.standard_normal(cols).astype(F32)
    b = rng.standard_normal(cols).astype(F32)
    eps = 1e-3
    n, stat = rows * cols, (rows if axis == 1 else cols)
    y, xhat, rstd = mod.Array(n), mod.Array(n), mod.Array(stat)
    args = [_buf(mod, x), _buf(mod, w), _buf(mod, b), rows, cols, eps, y, xhat, rstd]
    if kind == "batchnorm":
        mean, var = mod.Array(cols), mod.Array(cols)
        args += [mean, var]
    fwd(*args)
    want_y, want_xhat, want_rstd, want_mean, want_var = norm64(x, w, b, eps, axis)
    np.testing.assert_allclose(_read(mod, y, x.shape), want_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_read(mod, xhat, x.shape), want_xhat, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_read(mod, rstd, (stat,)), want_rstd.reshape(-1), rtol=1e-4)
    if kind == "batchnorm":
        np.testing.assert_allclose(_read(mod, mean, (cols,)), want_mean[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_read(mod, var, (cols,)), want_var[0], rtol=1e-4, atol=1e-6)

    dy = rng.standard_normal((rows, cols)).astype(F32)
    dx, dw, db = mod.Array(n), mod.Array(cols), mod.Array(cols)
    bwd(_buf(mod, dy), xhat, rstd, _buf(mod, w), rows, cols, dx, dw, db)
    x64, w64, b64 = (a.astype(np.float64) for a in (x, w, b))
    want_dx = vjp(lambda v: norm64(v, w64, b64, eps, axis)[0], x64, dy)
    want_dw = vjp(lambda v: norm64(x64, v, b64, eps, axis)[0], w64, dy)
    # float32 rounding in xhat, amplified by rstd (which is 1/sqrt(eps) for a constant slice)
    scale = np.abs(want_dx).max() + np.abs(dy).max() * want_rstd.max()
    np.testing.assert_allclose(_read(mod, dx, x.shape), want_dx, rtol=1e-3, atol=1e-5 * scale)
    np.testing.assert_allclose(_read(mod, dw, (cols,)), want_dw, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(_read(mod, db, (cols,)), dy.sum(axis=0), rtol=1e-4, atol=1e-5)


def test_row_kernels_on_threads_match_the_numpy_module():
    """Softmax cross-entropy and layer norm over enough rows to be split among threads (and
    columns that are no multiple of the vector width) agree with the numpy module's kernels."""
    cpu = nd.cpu()
    if not cpu.enabled():
        pytest.skip("cpu() is not built")
    ref = nd.cpu_numpy().mod
    rng = np.random.default_rng(5)
    rows, cols = 301, 1003
    z = (rng.standard_normal((rows, cols)) * 3).astype(F32)
    y = rng.integers(0, cols, rows)
    out = {}
    for mod in (cpu.mod, ref):
        loss, probs = mod.Array(rows), mod.Array(rows * cols)
        mod.softmax_xent(_buf(mod, z), _buf(mod, y), rows, cols, loss, probs)
        w, b = _buf(mod, z[0]), _buf(mod, z[1])
        ln = [mod.Array(rows * cols), mod.Array(rows * cols), mod.Array(rows)]
        mod.layernorm_fwd(_buf(mod, z), w, b, rows, cols, 1e-5, *ln)
        grads = [mod.Array(rows * cols), mod.Array(cols), mod.Array(cols)]
        mod.layernorm_bwd(_buf(mod, z[::-1].copy()), ln[1], ln[2], w, rows, cols, *grads)
        out[mod] = [
            _read(mod, loss, (rows,)),
            _read(mod, probs, (rows, cols)),
            _read(mod, ln[0], (rows, cols)),
            _read(mod, ln[2], (rows,)),
            _read(mod, grads[0], (rows, cols)),
            _read(mod, grads[1], (cols,)),
        ]
    for got, want in zip(out[cpu.mod], out[ref]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * (np.abs(want).max() + 1))


@pytest.mark.parametrize("dev", MODULES)
def test_kernel_norms_reject_bad_sizes(dev):
    mod, fwd = _kernel(dev, "layernorm_fwd")
    x = _buf(mod, np.zeros((2, 3)))
    with pytest.raises(ValueError):  # w has 2 elements, cols is 3
        fwd(
            x,
            _buf(mod, [1, 1]),
            _buf(mod, [0, 0, 0]),
            2,
            3,
            1e-5,
            mod.Array(6),
            mod.Array(6),
            mod.Array(2),
        )
    _, bfwd = _kernel(dev, "batchnorm_fwd")
    with pytest.raises(ValueError):  # rstd must have cols elements
        bfwd(
            x,
            _buf(mod, [1, 1, 1]),
            _buf(mod, [0, 0, 0]),
            2,
            3,
            1e-5,
            mod.Array(6),
            mod.Array(6),
            mod.Array(2),
            mod.Array(3),
            mod.Array(3),
        )


@pytest.mark.parametrize("dev", MODULES)
@pytest.mark.parametrize("batch, hidden", [(1, 1), (3, 5), (8, 33)])
def test_kernel_lstm_cell(dev, batch, hidden):
    mod, fwd = _kernel(dev, "lstm_cell_fwd")
    _, bwd = _kernel(dev, "lstm_cell_bwd")
    rng = np.random.default_rng(batch * hidden)
    gates = (rng.standard_normal((batch, 4 * hidden)) * 2).astype(F32)
    c_prev = rng.standard_normal((batch, hidden)).astype(F32)
    n = batch * hidden
    h, c, act, tanh_c = mod.Array(n), mod.Array(n), mod.Array(4 * n), mod.Array(n)
    fwd(_buf(mod, gates), _buf(mod, c_prev), batch, hidden, h, c, act, tanh_c)
    want = lstm64(gates, c_prev.astype(np.float64))
    for got, shape, expected in zip(
        (h, c, act, tanh_c), ((batch, hidden),) * 2 + ((batch, 4 * hidden), (batch, hidden)), want
    ):
        np.testing.assert_allclose(_read(mod, got, shape), expected, rtol=1e-5, atol=1e-6)

    dh = rng.standard_normal((batch, hidden)).astype(F32)
    dc = rng.standard_normal((batch, hidden)).astype(F32)
    dgates, dc_prev = mod.Array(4 * n), mod.Array(n)
    bwd(
        _buf(mod, dh), _buf(mod, dc), act, _buf(mod, c_prev), tanh_c, batch, hidden, dgates, dc_prev
    )
    g64, c64 = gates.astype(np.float64), c_prev.astype(np.float64)

    def objective(out):
        return out[0] * dh + out[1] * dc

    want_dg = central_difference(lambda v: float(objective(lstm64(v, c64)).sum()), g64)
    want_dc = central_difference(lambda v: float(objective(lstm64(g64, v)).sum()), c64)
    np.testing.assert_allclose(_read(mod, dgates, gates.shape), want_dg, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(_read(mod, dc_prev, c_prev.shape), want_dc, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dev", MODULES)
def test_kernel_lstm_cell_saturates_without_nan(dev):
    mod, fwd = _kernel(dev, "lstm_cell_fwd")
    gates = np.array([[-1e4, 1e4, 1e4, -1e4]], F32)  # i = 0, f = 1, g = 1, o = 0
    h, c, act, tanh_c = mod.Array(1), mod.Array(1), mod.Array(4), mod.Array(1)
    fwd(_buf(mod, gates), _buf(mod, [[0.5]]), 1, 1, h, c, act, tanh_c)
    np.testing.assert_allclose(_read(mod, act, (4,)), [0, 1, 1, 0], atol=1e-7)
    np.testing.assert_allclose(_read(mod, c, (1,)), [0.5], rtol=1e-6)
    np.testing.assert_allclose(_read(mod, h, (1,)), [0.0], atol=1e-7)


def sgd64(p, g, u, lr, mom, wd):
    g = g + wd * p
    u = mom * u + (1 - mom) * g
    return p - lr * u, u


def adam64(p, g, m, v, lr, b1, b2, eps, wd, t):
    g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps), m, v


@pytest.mark.parametrize("dev", MODULES)
@pytest.mark.parametrize("size", [1, 37, 1000])
def test_kernel_optimizer_updates(dev, size):
    mod, sgd = _kernel(dev, "sgd_update")
    _, adam = _kernel(dev, "adam_update")
    rng = np.random.default_rng(size)
    p, u, m = (rng.standard_normal(size).astype(F32) for _ in range(3))
    v = rng.uniform(0, 1, size).astype(F32)
    pb, ub = _buf(mod, p), _buf(mod, u)
    ptr = pb.ptr()
    g = rng.standard_normal(size).astype(F32)
    gb = _buf(mod, g)
    p64, u64 = p.astype(np.float64), u
    for _ in range(3):  # the state carries over between calls
        sgd(pb, gb, ub, 0.1, 0.9, 0.01)
        p64, u64 = sgd64(p64, g, u64, 0.1, 0.9, 0.01)
    assert pb.ptr() == ptr
    np.testing.assert_allclose(_read(mod, pb, (size,)), p64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_read(mod, ub, (size,)), u64, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(_read(mod, gb, (size,)), g)  # the gradient is read only

    pb, mb, vb = _buf(mod, p), _buf(mod, m), _buf(mod, v)
    p64, m64, v64 = p.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
    for t in (1, 2, 3):
        adam(pb, gb, mb, vb, 0.01, 0.8, 0.99, 1e-8, 0.1, t)
        p64, m64, v64 = adam64(p64, g, m64, v64, 0.01, 0.8, 0.99, 1e-8, 0.1, t)
    np.testing.assert_allclose(_read(mod, pb, (size,)), p64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_read(mod, mb, (size,)), m64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_read(mod, vb, (size,)), v64, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError):  # grad of another size
        sgd(pb, mod.Array(size + 1), ub, 0.1, 0.0, 0.0)

    # momentum 0: buf = g + wd·p, its old contents (here NaN) not read, so any scratch will do
    pb, ub = _buf(mod, p), _buf(mod, np.full(size, np.nan, F32))
    sgd(pb, gb, ub, 0.1, 0.0, 0.01)
    p64, u64 = sgd64(p.astype(np.float64), g, np.zeros(size), 0.1, 0.0, 0.01)
    np.testing.assert_allclose(_read(mod, pb, (size,)), p64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_read(mod, ub, (size,)), u64, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        adam(pb, gb, mb, mod.Array(size + 1), 0.01, 0.9, 0.999, 1e-8, 0.0, 1)


# ---- the array-level functions (NDArray on every device; numpy) ---------------------------------
def _array_apis():
    """(name, to_array, from_array, functions): NDArray on each enabled device, and numpy."""
    params = [
        pytest.param((lambda a: np.array(a, F32), np.asarray, npf), id="numpy-f32"),
        pytest.param((lambda a: np.array(a, np.float64), np.asarray, npf), id="numpy-f64"),
    ]
    for p in _modules():
        dev = p.values[0]
        params.append(
            pytest.param(
                (lambda a, d=dev: nd.array(np.asarray(a, F32), device=d), lambda a: a.numpy(), nd),
                id=f"NDArray-{p.id}",
                marks=p.marks,
            )
        )
    return params


APIS = _array_apis()


@pytest.mark.parametrize("api", APIS)
def test_array_functions_match_the_oracles(api):
    make, host, fns = api
    rng = np.random.default_rng(1)
    z = rng.standard_normal((5, 4))
    y = np.array([0, 3, 1, 1, 2])
    loss, probs = fns.softmax_xent(make(z), make(y))
    want_loss, want_probs = xent64(z, y)
    np.testing.assert_allclose(host(loss), want_loss, rtol=1e-5)
    one_hot = np.eye(4)[y]
    dloss = rng.standard_normal(5)
    np.testing.assert_allclose(
        host(fns.softmax_xent_bwd(probs, make(y), make(dloss))),
        (want_probs - one_hot) * dloss[:, None],
        rtol=1e-5,
        atol=1e-6,
    )
    shared = fns.softmax_xent_bwd(probs, make(y), make(np.array(0.5)), 0.25)
    np.testing.assert_allclose(host(shared), (want_probs - one_hot) * 0.125, rtol=1e-5, atol=1e-6)
    written = fns.softmax_xent_bwd(probs, make(y), make(np.array(0.5)), 0.25, out=probs)
    assert written is probs  # the probabilities are overwritten with the gradient
    np.testing.assert_array_equal(host(probs), host(shared))

    x, w, b = rng.standard_normal((5, 4)), rng.standard_normal(4), rng.standard_normal(4)
    yl, xhat, rstd = fns.layernorm_fwd(make(x), make(w), make(b), 1e-5)
    np.testing.assert_allclose(host(yl), norm64(x, w, b, 1e-5, 1)[0], rtol=1e-4, atol=1e-5)
    dx, dw, db = fns.layernorm_bwd(make(x), xhat, rstd, make(w))
    assert host(dx).shape == (5, 4) and host(dw).shape == (4,) and host(db).shape == (4,)
    yb, xhat, rstd, mean, var = fns.batchnorm_fwd(make(x), make(w), make(b), 1e-5)
    np.testing.assert_allclose(host(yb), norm64(x, w, b, 1e-5, 0)[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(host(mean), x.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(var), x.var(axis=0), rtol=1e-4, atol=1e-6)
    gates, c_prev = rng.standard_normal((3, 8)), rng.standard_normal((3, 2))
    h, c, act, tanh_c = fns.lstm_cell_fwd(make(gates), make(c_prev))
    np.testing.assert_allclose(host(h), lstm64(gates, c_prev)[0], rtol=1e-5, atol=1e-6)
    dg, dcp = fns.lstm_cell_bwd(make(c_prev), make(c_prev), act, make(c_prev), tanh_c)
    assert host(dg).shape == (3, 8) and host(dcp).shape == (3, 2)


@pytest.mark.parametrize("api", APIS)
def test_array_functions_reject_bad_arguments(api):
    make, host, fns = api
    with pytest.raises(TypeError):
        fns.softmax_xent([[1.0, 2.0]], make([0]))
    with pytest.raises(ValueError, match="labels"):
        fns.softmax_xent(make(np.zeros((2, 3))), make([0, 1, 2]))
    with pytest.raises(ValueError, match="label"):
        fns.softmax_xent(make(np.zeros((2, 3))), make([0, 3]))
    probs, labels, dloss = make(np.full((2, 3), 0.5)), make([0, 1]), make([1.0, 1.0])
    with pytest.raises(ValueError, match="softmax_xent_bwd: out must"):
        fns.softmax_xent_bwd(probs, labels, dloss, out=make(np.zeros((3, 2))))
    with pytest.raises(TypeError, match="softmax_xent_bwd: out must"):
        fns.softmax_xent_bwd(probs, labels, dloss, out=[[0.0] * 3] * 2)
    with pytest.raises(ValueError, match="label"):
        fns.softmax_xent_bwd(probs, make([0, 3]), dloss, out=probs)
    np.testing.assert_array_equal(host(probs), np.full((2, 3), 0.5))  # nothing written
    with pytest.raises(ValueError, match="2-D"):
        fns.layernorm_fwd(make(np.zeros(3)), make(np.ones(3)), make(np.zeros(3)), 1e-5)
    with pytest.raises(ValueError, match="w"):
        fns.layernorm_fwd(make(np.zeros((2, 3))), make(np.ones(2)), make(np.zeros(3)), 1e-5)
    with pytest.raises(ValueError, match="empty batch"):
        fns.batchnorm_fwd(make(np.zeros((0, 3))), make(np.ones(3)), make(np.zeros(3)), 1e-5)
    with pytest.raises(ValueError, match="gates"):
        fns.lstm_cell_fwd(make(np.zeros((2, 7))), make(np.zeros((2, 2))))
    p = make(np.zeros(3))
    with pytest.raises(ValueError, match="grad"):
        fns.sgd_update_(p, make(np.zeros(4)), make(np.zeros(3)), 0.1, 0.0, 0.0)
    with pytest.raises(ValueError, match="step"):
        fns.adam_update_(p, p, make(np.zeros(3)), make(np.zeros(3)), 0.1, 0.9, 0.9, 1e-8, 0.0, 0)


@pytest.mark.parametrize("api", APIS)
def test_updates_are_in_place(api):
    make, host, fns = api
    rng = np.random.default_rng(2)
    p0, g = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    p, buf = make(p0), make(np.zeros((3, 4)))
    fns.sgd_update_(p, make(g), buf, 0.5, 0.0, 0.0)
    np.testing.assert_allclose(host(p), p0 - 0.5 * g, rtol=1e-6, atol=1e-7)
    m, v = make(np.zeros((3, 4))), make(np.zeros((3, 4)))
    fns.adam_update_(p, make(g), m, v, 0.1, 0.9, 0.999, 1e-8, 0.0, 1)
    # the first bias-corrected Adam step moves every weight by lr·sign(g)
    np.testing.assert_allclose(host(p), p0 - 0.5 * g - 0.1 * np.sign(g), rtol=1e-5, atol=1e-6)


def test_ndarray_update_of_a_strided_view_writes_through():
    dev = nd.cpu_numpy()
    base = nd.array(np.arange(12, dtype=F32).reshape(3, 4), device=dev)
    view = base[:, 1:3]  # not compact
    g = nd.array(np.ones((3, 2), F32), device=dev)
    nd.sgd_update_(view, g, nd.array(np.zeros((3, 2), F32), device=dev), 1.0, 0.0, 0.0)
    want = np.arange(12, dtype=F32).reshape(3, 4)
    want[:, 1:3] -= 1
    np.testing.assert_array_equal(base.numpy(), want)
    with pytest.raises(ValueError, match="broadcast"):
        row = nd.array(np.zeros((1, 2), F32), device=dev).broadcast_to((3, 2))
        nd.sgd_update_(row, g, nd.array(np.zeros((3, 2), F32), device=dev), 1.0, 0.0, 0.0)


def test_numpy_update_of_a_read_only_array_is_refused():
    p = np.broadcast_to(np.zeros((1, 2)), (3, 2))
    with pytest.raises(ValueError, match="read-only"):
        npf.sgd_update_(p, np.ones((3, 2)), np.zeros((3, 2)), 1.0, 0.0, 0.0)


def test_ndarray_functions_reject_mixed_devices():
    if not nd.cpu().enabled():
        pytest.skip("needs two enabled devices")
    z = nd.array(np.zeros((2, 3), F32), device=nd.cpu())
    y = nd.array(np.zeros(2, F32), device=nd.cpu_numpy())
    with pytest.raises(ValueError, match="cpu"):
        nd.softmax_xent(z, y)
    arrays = (np.full((2, 3), 0.5), [0, 1], [1, 1])
    p, labels, dloss = (nd.array(a, device=nd.cpu()) for a in arrays)
    with pytest.raises(ValueError, match="out is on cpu_numpy"):
        nd.softmax_xent_bwd(p, labels, dloss, out=nd.array(p.numpy(), device=nd.cpu_numpy()))
    transposed = p.permute((1, 0)).compact().permute((1, 0))  # (2, 3), not row-major
    with pytest.raises(ValueError, match="compact"):
        nd.softmax_xent_bwd(p, labels, dloss, out=transposed)


# ---- fused ops and modules against the course's unfused compositions ----------------------------
def unfused_softmax_loss(z, y_np, device):
    k = z.shape[1]
    one_hot = ndl.Tensor(np.eye(k, dtype=F32)[y_np], device=device, requires_grad=False)
    z_y = ops.summation(z * one_hot, axes=(1,))
    return ops.summation(ops.logsumexp(z, axes=(1,)) - z_y) / z.shape[0]


def unfused_norm(x, w, b, eps, axis):
    n = x.shape[axis]
    keep = (1, x.shape[1]) if axis == 0 else (x.shape[0], 1)
    mean = (ops.summation(x, axes=(axis,)) / n).reshape(keep).broadcast_to(x.shape)
    centred = x - mean
    var = (ops.summation(centred**2, axes=(axis,)) / n).reshape(keep).broadcast_to(x.shape)
    row = (1, x.shape[1])
    return w.reshape(row).broadcast_to(x.shape) * (centred / (var + eps) ** 0.5) + b.reshape(
        row
    ).broadcast_to(x.shape)


def unfused_lstm(gates, c_prev):
    H = c_prev.shape[1]
    sig = nn.Sigmoid()
    parts = ops.split(gates.reshape((gates.shape[0], 4, H)), 1)
    i, f, g, o = sig(parts[0]), sig(parts[1]), ops.tanh(parts[2]), sig(parts[3])
    c = f * c_prev + i * g
    return o * ops.tanh(c), c


def _compare(fused_fn, unfused_fn, arrays, device, rtol=1e-4, atol=1e-5):
    """Same values and the same gradients (random adjoint) from the fused and unfused graphs."""
    rng = np.random.default_rng(0)
    results = []
    for fn in (fused_fn, unfused_fn):
        inputs = [float32_tensor(a, device) for a in arrays]
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        weights = (
            [rng.standard_normal(o.shape).astype(F32) for o in outs]
            if not results
            else results[0][2]
        )
        total = None
        for o, w in zip(outs, weights):
            term = (o * ndl.Tensor(w, device=device, requires_grad=False)).sum()
            total = term if total is None else total + term
        total.backward()
        results.append(([o.numpy() for o in outs], [t.grad.numpy() for t in inputs], weights))
    (vals_f, grads_f, _), (vals_u, grads_u, _) = results
    for a, b in zip(vals_f, vals_u):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    for a, b in zip(grads_f, grads_u):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * max(1.0, np.abs(b).max()))


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_loss_matches_the_unfused_composition(device):
    rng = np.random.default_rng(3)
    z = rng.standard_normal((6, 5)) * 3
    y = rng.integers(0, 5, 6)
    labels = ndl.Tensor(y.astype(F32), device=device, requires_grad=False)
    _compare(
        lambda t: nn.SoftmaxLoss()(t, labels),
        lambda t: unfused_softmax_loss(t, y, device),
        [z],
        device,
    )
    check_gradients(lambda t: ops_fused.softmax_cross_entropy(t, labels), z, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_last_axis_matches_numpy_finite_differences_and_twice(device):
    rng = np.random.default_rng(4)
    z = rng.standard_normal((2, 3, 5)) * 3
    z[0, 1, 2] = -np.finfo(np.float32).max  # a masked logit (the causal mask) gets weight 0
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    out = ops_fused.softmax_last_axis(float32_tensor(z, device))
    np.testing.assert_allclose(out.numpy(), e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-7)
    check_gradients(ops_fused.softmax_last_axis, rng.standard_normal((3, 4)), device=device)
    # its gradient is built from needle ops: d/dz Σ_j (∂/∂z_j Σ w·softmax(z)) by differences
    w = rng.standard_normal((1, 4))
    x = rng.standard_normal((1, 4))

    def first(v):
        s = np.exp(v - v.max()) / np.exp(v - v.max()).sum()
        return (s * (w - (w * s).sum())).sum()

    zt = float32_tensor(x, device)
    (ops_fused.softmax_last_axis(zt) * float32_tensor(w, device)).sum().backward(create_graph=True)
    grad = zt.grad
    zt.grad = None
    grad.sum().backward()
    np.testing.assert_allclose(zt.grad.numpy(), central_difference(first, x), rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tq,tk", [(4, 4), (3, 5), (4, 2)])
def test_masked_softmax_finite_differences_and_twice(device, tq, tk):
    # softmax_last_axis(x, scale, causal=True): the weights of the course's scale·x + mask,
    # gradients by central differences of a float64 formula, and differentiable twice
    rng = np.random.default_rng(tq * 10 + tk)
    scale = 0.6
    allowed = np.arange(tk)[None, :] <= np.arange(tq)[:, None] + (tk - tq)
    sees = allowed.any(axis=1, keepdims=True)

    def probs64(v):
        z = np.where(allowed, scale * v, -np.inf)
        z = np.where(sees, z, 0.0)  # a query that sees no key: uniform, as the course's mask
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    x = rng.standard_normal((2, tq, tk))
    out = ops_fused.softmax_last_axis(float32_tensor(x, device), scale=scale, causal=True)
    np.testing.assert_allclose(out.numpy(), probs64(x), rtol=1e-5, atol=1e-7)
    assert np.all(out.numpy()[:, ~allowed & sees] == 0)
    if sees.all():  # (a row that sees nothing is constant: its gradient is the course's formula)
        check_gradients(
            lambda t: ops_fused.softmax_last_axis(t, scale=scale, causal=True), x, device=device
        )
        w = rng.standard_normal((2, tq, tk))

        def first(v):
            s = probs64(v)
            return (scale * s * (w - (w * s).sum(axis=-1, keepdims=True))).sum()

        xt = float32_tensor(x, device)
        y = ops_fused.softmax_last_axis(xt, scale=scale, causal=True)
        (y * float32_tensor(w, device)).sum().backward(create_graph=True)
        grad = xt.grad
        xt.grad = None
        grad.sum().backward()
        np.testing.assert_allclose(
            xt.grad.numpy(), central_difference(first, x), rtol=2e-3, atol=2e-4
        )


@pytest.mark.parametrize("api", ["nd", "np"])
def test_softmax_fwd_checks_queries_and_shapes(api):
    x = np.zeros((6, 4), F32)
    if api == "nd":
        fwd, bwd, arr = nd.softmax_fwd, nd.softmax_bwd, lambda a: nd.array(a, device=nd.cpu_numpy())
    else:
        fwd, bwd, arr = npf.softmax_fwd, npf.softmax_bwd, lambda a: a
    for queries in (-1, 1.5, float("nan"), float("inf"), 4):  # 4 does not divide 6 rows
        with pytest.raises(ValueError, match="softmax_fwd: .*queries"):
            fwd(arr(x), 1.0, queries)
    for queries in ("3", None):
        with pytest.raises(TypeError, match="softmax_fwd: queries"):
            fwd(arr(x), 1.0, queries)
    with pytest.raises(ValueError, match="softmax_fwd: x must be 2-D"):
        fwd(arr(np.zeros(4, F32)), 1.0, 0)
    with pytest.raises(ValueError, match="softmax_bwd: dy must have shape"):
        bwd(arr(x), arr(np.zeros((6, 3), F32)), 1.0)
    y = fwd(arr(x), 1.0, 3)  # 2 blocks of 3 queries over 4 keys: row i sees i + 2 keys
    np.testing.assert_allclose(
        np.asarray(y.numpy() if api == "nd" else y)[:3, 0], [1 / 2, 1 / 3, 1 / 4]
    )


@pytest.mark.parametrize("device", DEVICES)
def test_masked_softmax_rejects_a_vector(device):
    with pytest.raises(ValueError, match="causal softmax needs logits"):
        ops_fused.softmax_last_axis(float32_tensor(np.ones(3), device), causal=True)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_loss_with_minus_inf_logit(device):
    # the course's logits·one_hot gives -inf·0 = NaN here; PyTorch gives 1.3133
    z = float32_tensor([[-np.inf, 0.0, 1.0]], device)
    loss = fast.fuse(nn.SoftmaxLoss())(z, ndl.Tensor([1.0], device=device, requires_grad=False))
    loss.backward()
    np.testing.assert_allclose(loss.numpy(), np.log1p(np.e), rtol=1e-6)
    p = np.e / (1 + np.e)
    np.testing.assert_allclose(z.grad.numpy(), [[0.0, -p, p]], rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_loss_labels_on_another_device_and_no_label_gradient(device):
    z = float32_tensor(np.zeros((2, 3)), device)
    y = ndl.Tensor([2.0, 0.0], requires_grad=True)  # default device, and requires_grad
    loss = nn.SoftmaxLoss()(z, y)
    loss.backward()
    np.testing.assert_allclose(loss.numpy(), np.log(3), rtol=1e-6)
    assert y.grad is None
    with pytest.raises(ValueError, match="label"):
        nn.SoftmaxLoss()(z, ndl.Tensor([2.0, 5.0], device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(7, 6), (1, 3), (2, 3, 4)])
def test_layernorm_matches_the_unfused_composition(device, shape):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape) * 2 + 0.5
    w, b = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])

    def fused(xt, wt, bt):
        ln = nn.LayerNorm1d(shape[-1], eps=1e-3, device=device)
        ln.weight, ln.bias = wt, bt
        return ln(xt)

    def unfused(xt, wt, bt):
        flat = xt.reshape((int(np.prod(shape[:-1])), shape[-1]))
        return unfused_norm(flat, wt, bt, 1e-3, 1).reshape(shape)

    _compare(fused, unfused, [x, w, b], device)
    if len(shape) == 2:
        check_gradients(lambda *t: ops_fused.layernorm_rows(*t, 1e-3), x, w, b, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm_matches_the_unfused_composition(device):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 5)) * 2 + 0.5
    w, b = rng.standard_normal(5), rng.standard_normal(5)

    def fused(xt, wt, bt):
        bn = nn.BatchNorm1d(5, eps=1e-3, device=device)
        bn.weight, bn.bias = wt, bt
        return bn(xt)

    _compare(fused, lambda xt, wt, bt: unfused_norm(xt, wt, bt, 1e-3, 0), [x, w, b], device)
    check_gradients(lambda *t: ops_fused.batchnorm_columns(*t, 1e-3), x, w, b, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm_running_statistics(device):
    rng = np.random.default_rng(6)
    bn = nn.BatchNorm1d(3, momentum=0.25, device=device)
    xs = [rng.standard_normal((4, 3)).astype(F32) * 2 + 1 for _ in range(3)]
    mean, var = np.zeros(3), np.ones(3)
    for x in xs:
        bn(float32_tensor(x, device))
        mean = 0.75 * mean + 0.25 * x.mean(axis=0)
        var = 0.75 * var + 0.25 * x.var(axis=0)  # biased, as the course
    np.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), var, rtol=1e-5, atol=1e-6)
    assert bn.running_mean.op is None and not bn.running_mean.requires_grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch, hidden", [(1, 1), (3, 4)])
def test_lstm_cell_op_matches_the_unfused_composition(device, batch, hidden):
    rng = np.random.default_rng(7)
    gates = rng.standard_normal((batch, 4 * hidden)) * 2
    c_prev = rng.standard_normal((batch, hidden))
    _compare(lambda g, c: ops_fused.lstm_cell_step(g, c), unfused_lstm, [gates, c_prev], device)


@pytest.mark.parametrize("device", DEVICES)
def test_lstm_gradient_through_time_matches_the_unfused_composition(device):
    # two layers, three steps: h and c of each step feed the next, only h reaches the output
    rng = np.random.default_rng(8)
    np.random.seed(0)
    model = nn.LSTM(3, 4, num_layers=2, device=device)
    x = rng.standard_normal((3, 2, 3)).astype(F32)
    out, (h_n, c_n) = model(float32_tensor(x, device))
    (out.sum() + c_n.sum() * 0.5).backward()
    fused_grads = [p.grad.numpy() for p in model.parameters()]
    values = (out.numpy(), h_n.numpy(), c_n.numpy())

    for p in model.parameters():
        p.grad = None
    # the same model run step by step, each step written with the course's ops
    layer_input, h_n, c_n = float32_tensor(x, device), [], []
    for cell in model.lstm_cells:
        h = c = ndl.init.zeros(2, 4, device=device)
        outputs = []
        for x_t in ndl.split(layer_input, 0):
            h, c = unfused_lstm(
                x_t @ cell.W_ih
                + cell.bias_ih.reshape((1, 16)).broadcast_to((2, 16))
                + cell.bias_hh.reshape((1, 16)).broadcast_to((2, 16))
                + h @ cell.W_hh,
                c,
            )
            outputs.append(h)
        h_n.append(h)
        c_n.append(c)
        layer_input = ndl.stack(outputs, 0)
    out, h_n, c_n = layer_input, ndl.stack(h_n, 0), ndl.stack(c_n, 0)
    (out.sum() + c_n.sum() * 0.5).backward()
    for a, b in zip(values, (out.numpy(), h_n.numpy(), c_n.numpy())):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, p in zip(fused_grads, model.parameters()):
        np.testing.assert_allclose(a, p.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm_op_returns_its_statistics_with_exact_gradients(device):
    """BatchNormColumns gives (y, batch mean, biased batch var); each is differentiable and
    agrees with the course's ops, values and gradients."""
    rng = np.random.default_rng(10)
    x, w, b = rng.standard_normal((6, 3)), rng.standard_normal(3), rng.standard_normal(3)

    def fused(xt, wt, bt):
        out = ops_fused.BatchNormColumns(1e-3)(xt, wt, bt)
        return out[0], out[1], out[2]

    def unfused(xt, wt, bt):
        mean = ops.summation(xt, axes=(0,)) / 6
        centred = xt - mean.reshape((1, 3)).broadcast_to(xt.shape)
        return unfused_norm(xt, wt, bt, 1e-3, 0), mean, ops.summation(centred**2, axes=(0,)) / 6

    _compare(fused, unfused, [x, w, b], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pre_bias", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_batchnorm_train_is_bias_norm_and_relu_in_one_node(device, pre_bias, relu):
    """BatchNormTrain gives the bits of bias_add, BatchNormColumns's y and relu called in
    turn, output and every gradient, on channels-last (N, H, W, C) input, as one graph node;
    its gradients pass finite differences."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 3, 4)) * 2 + 0.5
    c, w, b = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4)
    adjoint = rng.standard_normal(x.shape)

    def one_node(xt, ct, wt, bt):
        bias = ct if pre_bias else None
        return ops_fused.batchnorm_train(xt, wt, bt, 1e-3, bias=bias, relu=relu)

    def in_turn(xt, ct, wt, bt):
        h = ops.bias_add(xt, ct) if pre_bias else xt
        y = ops_fused.BatchNormColumns(1e-3)(h, wt, bt)[0]
        return ops.relu(y) if relu else y

    def run(fn):
        ts = [float32_tensor(a, device) for a in (x, c, w, b)]
        out = fn(*ts)
        out.backward(float32_tensor(adjoint, device, requires_grad=False))
        return out, [out.numpy()] + [t.grad.numpy() for t in ts if t.grad is not None]

    out, got = run(one_node)
    _, want = run(in_turn)
    assert len(got) == len(want) == (5 if pre_bias else 4)
    for g, v in zip(got, want):
        np.testing.assert_array_equal(g, v)
    assert isinstance(out.op, ops_fused.BatchNormTrain) and len(out.inputs) == len(got) - 1
    assert all(t.op is None for t in out.inputs)  # the leaves themselves: nothing in between
    bias = float32_tensor(c, device) if pre_bias else None
    dx = check_gradients(lambda xt, wt, bt: one_node(xt, bias, wt, bt), x, w, b, device=device)[0]
    if pre_bias:  # the norm removes any shift: the bias's exact adjoint is 0 (rounding aside)
        assert np.abs(got[2]).max() <= 1e-5 * np.abs(dx).max() * dx[..., 0].size


@pytest.mark.parametrize("device", DEVICES)
def test_batchnorm_train_hands_over_its_statistics_once(device):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((5, 2, 3))
    op = ops_fused.BatchNormTrain(1e-5)
    op(
        float32_tensor(x, device),
        float32_tensor(np.ones(3), device),
        float32_tensor(np.zeros(3), device),
    )
    mean, var = op.statistics()
    rows = x.reshape(-1, 3)
    np.testing.assert_allclose(mean.numpy(), rows.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var.numpy(), rows.var(axis=0), rtol=1e-4, atol=1e-6)
    with pytest.raises(RuntimeError, match="already taken"):
        op.statistics()
    ones = float32_tensor(np.ones(3), device)
    with pytest.raises(ValueError, match="bias exactly when made with pre_bias"):
        op.apply(float32_tensor(x, device), ones, ones, bias=ones)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "which", ["softmax", "layernorm", "batchnorm", "batchnorm_train", "lstm", "lstm_layer"]
)
def test_second_derivative_of_a_fused_op_raises(device, which):
    rng = np.random.default_rng(9)
    x = float32_tensor(rng.standard_normal((3, 4)), device)
    w = float32_tensor(rng.standard_normal(4), device)
    b = float32_tensor(rng.standard_normal(4), device)
    if which == "softmax":
        out = ops_fused.softmax_cross_entropy(x, ndl.Tensor([0.0, 1.0, 3.0], device=device))
    elif which == "lstm":
        out = ops_fused.lstm_cell_step(x, float32_tensor(rng.standard_normal((3, 1)), device))[0]
    elif which == "lstm_layer":
        state = float32_tensor(rng.standard_normal((3, 1)), device)
        w_hh = float32_tensor(rng.standard_normal((1, 4)), device)
        out = ops_fused.lstm_layer(x.reshape((1, 3, 4)), state, state, w_hh)[0]
    elif which == "batchnorm_train":
        out = ops_fused.batchnorm_train(x, w, b, 1e-5, bias=b, relu=True)
    else:
        out = getattr(ops_fused, which + "_rows" if which == "layernorm" else which + "_columns")(
            x, w, b, 1e-5
        )
    (out * out).sum().backward(create_graph=True)
    with pytest.raises(NotImplementedError, match="second derivative"):
        x.grad.sum().backward()


# ---- edge cases the fused kernels used to get silently wrong ------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_softmax_loss_of_an_empty_batch_is_nan(device):
    """The mean of nothing is NaN in numpy and PyTorch; it used to be 0.0."""
    logits = ndl.Tensor(np.zeros((0, 5), np.float32), device=device)
    labels = ndl.Tensor(np.zeros((0,), np.float32), device=device, requires_grad=False)
    assert np.isnan(nn.SoftmaxLoss()(logits, labels).numpy())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [1.0, 3e19, 1e36])
def test_norms_of_huge_values_match_float64(device, scale):
    """|x| above about 2e19 has a variance beyond float32: LayerNorm and BatchNorm used to
    return zeros there. Checked against the float64 formula at every scale."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 4)) * scale).astype(np.float32)
    x64 = x.astype(np.float64)

    def normalised(axis):
        centred = x64 - x64.mean(axis=axis, keepdims=True)
        return centred / np.sqrt((centred**2).mean(axis=axis, keepdims=True) + 1e-5)

    layer = fast.fuse(nn.LayerNorm1d(4, device=device))(ndl.Tensor(x, device=device)).numpy()
    batch = fast.fuse(nn.BatchNorm1d(4, device=device))(ndl.Tensor(x, device=device)).numpy()
    np.testing.assert_allclose(layer, normalised(1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(batch, normalised(0), rtol=1e-4, atol=1e-4)


# ---- the embedding lookup: a gather forward, a scatter-add backward ------------------------------
def unfused_embedding(ids_np, w, device):
    """The course's formula: one_hot(ids) @ weight, the one-hot matrix a constant."""
    vocab = w.shape[0]
    one_hot = ndl.Tensor(
        np.eye(vocab)[ids_np.reshape(-1)], device=device, dtype=w.dtype, requires_grad=False
    )
    return (one_hot @ w).reshape(ids_np.shape + (w.shape[1],))


IDS = np.array([[0, 6, 2, 2], [1, 2, 6, 5], [2, 2, 0, 3]]).T  # (4, 3): rows 2 and 6 repeat


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_matches_the_one_hot_formula(device):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((7, 5))
    ids = ndl.Tensor(IDS.astype(F32), device=device, requires_grad=False)
    _compare(
        lambda t: ops_fused.embedding(ids, t),
        lambda t: unfused_embedding(IDS, t, device),
        [w],
        device,
        rtol=1e-6,
        atol=1e-6,
    )
    emb = nn.Embedding(7, 5, device=device)
    out = emb(ids)
    assert out.shape == (4, 3, 5) and out.dtype == emb.weight.dtype and out.device == device
    np.testing.assert_array_equal(out.numpy(), emb.weight.numpy()[IDS])


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_gradient_matches_finite_differences(device):
    rng = np.random.default_rng(6)
    ids = ndl.Tensor(IDS.astype(F32), device=device, requires_grad=False)
    (grad,) = check_gradients(
        lambda t: ops_fused.embedding(ids, t), rng.standard_normal((7, 5)), device=device
    )
    assert not grad[4].any()  # row 4 is never used: exactly zero
    # the scatter-add is linear too: its gradient (a gather) against differences
    add = ops_fused.EmbeddingScatterAdd(ids.realize_cached_data(), 7)
    check_gradients(lambda g: add(g), rng.standard_normal((4, 3, 5)), device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_differentiates_twice(device):
    """d/dW Σ R·dW where dW = scatter-add of the adjoint G: zero; d/dG = R[ids] (a gather)."""
    rng = np.random.default_rng(7)
    w = float32_tensor(rng.standard_normal((7, 5)), device)
    g = float32_tensor(rng.standard_normal((4, 3, 5)), device)
    r = rng.standard_normal((7, 5)).astype(F32)
    ids = ndl.Tensor(IDS.astype(F32), device=device, requires_grad=False)
    (ops_fused.embedding(ids, w) * g).sum().backward(create_graph=True)
    dw = w.grad
    w.grad = g.grad = None
    (dw * ndl.Tensor(r, device=device, requires_grad=False)).sum().backward()
    np.testing.assert_allclose(g.grad.numpy(), r[IDS], rtol=1e-6)
    assert w.grad is None or not w.grad.numpy().any()


@pytest.mark.parametrize("device", DEVICES)
def test_embedding_ids_on_another_device_get_no_gradient_and_are_checked(device):
    emb = fast.fuse(nn.Embedding(5, 2, device=device))
    ids = ndl.Tensor(np.array([[4.0, 0.0]]), requires_grad=True)  # default device
    out = emb(ids)
    out.sum().backward()
    assert ids.grad is None
    np.testing.assert_array_equal(emb.weight.grad.numpy()[[0, 4]], np.ones((2, 2)))
    for bad, shown in (
        (5.0, "got 5 at position 1"),
        (0.5, "got 0.5 at position 1"),
        (-1.0, "got -1 at position 1"),
    ):
        with pytest.raises(IndexError, match=r"whole numbers \(integers\) in \[0, 5\), " + shown):
            emb(ndl.Tensor(np.array([[1.0, bad]]), device=device))
    empty = emb(ndl.Tensor(np.zeros((0, 3)), device=device))
    assert empty.shape == (0, 3, 2)


def test_embedding_array_functions_agree_on_every_path():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((6, 4)).astype(F32)
    g = rng.standard_normal((9, 4)).astype(F32)
    ids = rng.integers(0, 6, 9).astype(F32)
    paths = [(npf, lambda a: a)] + [
        (nd, lambda a, d=d: nd.array(a, device=d))
        for d in (nd.cpu_numpy(), nd.cpu(), nd.cuda())
        if d.enabled()
    ]
    for module, make in paths:
        np.testing.assert_array_equal(
            np.asarray(_host(module.embedding_gather(make(w), make(ids)))), w[ids.astype(int)]
        )
        want = np.zeros((6, 4), F32)
        np.add.at(want, ids.astype(int), g)
        np.testing.assert_allclose(
            np.asarray(_host(module.embedding_scatter_add(make(g), make(ids), 6))),
            want,
            rtol=1e-6,
            atol=1e-6,
        )
        with pytest.raises(ValueError, match="embedding_scatter_add: vocab must be >= 0"):
            module.embedding_scatter_add(make(g), make(ids), -1)
        with pytest.raises(ValueError, match="embedding_gather: weight must be 2-D"):
            module.embedding_gather(make(ids), make(ids))


def _host(a):
    return a.numpy() if hasattr(a, "numpy") and not isinstance(a, np.ndarray) else a
