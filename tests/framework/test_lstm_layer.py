"""The LSTM layer kernels ``lstm_layer_fwd`` / ``lstm_layer_bwd`` (a layer's loop over the time
steps as one device call each way) and the op that calls them.

The kernels run on every device module that runs here, checked against oracles that share no
code with them:

* a float64 forward pass written here (the cell's formulas step by step, ``lstm64``) and, for
  the gradients, central differences of it;
* the per-step composition on the same module: ``matmul``, an add and ``lstm_cell_fwd`` per
  step forward, ``lstm_cell_bwd`` and ``matmul`` per step backward (the loop they replace);
* the numpy reference module ``cpu_numpy()``;

over random sizes including T = 1, B = 1, H = 1 and empty ones; wrong sizes and kinds are a
ValueError naming the argument or a TypeError, never a crash. The op (``nn.LSTM``) makes one
call per layer each way.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES
from helpers import central_difference, float32_tensor
from test_fused import MODULES, _buf, _read, lstm64
from test_ops_conv import _count_kernel_calls

import needle as ndl
from needle import backend_ndarray as nd
from needle import nn

pytestmark = pytest.mark.nn

F32 = np.float32
SIZES = [  # (steps, batch, hidden)
    (1, 1, 1),
    (1, 3, 2),
    (4, 1, 3),
    (3, 2, 1),
    (5, 3, 4),
    (9, 16, 33),
    (32, 16, 128),  # the course LSTM LM's layer (its products take the engine's unpacked path)
]


# ---- oracles ------------------------------------------------------------------------------------
def layer64(xw, h0, c0, w):
    """(out, h_T, c_T, act) of an LSTM layer in float64, step by step."""
    steps, (batch, hidden) = xw.shape[0], h0.shape
    out, act = np.zeros((steps, batch, hidden)), np.zeros((steps, batch, 4 * hidden))
    h, c = np.asarray(h0, np.float64), np.asarray(c0, np.float64)
    for t in range(steps):
        h, c, act[t], _ = lstm64(xw[t] + h @ w, c)
        out[t] = h
    return out, h, c, act


def _inputs(rng, steps, batch, hidden):
    xw = (rng.standard_normal((steps, batch, 4 * hidden)) * 1.5).astype(F32)
    h0, c0 = (rng.standard_normal((2, batch, hidden))).astype(F32)
    w = (rng.standard_normal((hidden, 4 * hidden)) / np.sqrt(max(hidden, 1))).astype(F32)
    return xw, h0, c0, w


def _fwd(mod, xw, h0, c0, w):
    """lstm_layer_fwd on ``mod``: (out, h, c, act) as numpy arrays."""
    steps, batch, hidden = xw.shape[0], h0.shape[0], h0.shape[1]
    shapes = [(steps, batch, hidden), (batch, hidden), (batch, hidden), (steps, batch, 4 * hidden)]
    outs = [mod.Array(int(np.prod(s))) for s in shapes]
    args = [_buf(mod, a) for a in (xw, h0, c0, w)]
    mod.lstm_layer_fwd(*args, batch, hidden, steps, *outs)
    return [_read(mod, o, s) for o, s in zip(outs, shapes)]


def _bwd(mod, grads, saved, h0, c0, w):
    """lstm_layer_bwd on ``mod``: (dxw, dh0, dc0, dw_hh) as numpy arrays."""
    d_out, dh, dc = grads
    act, out = saved
    steps, batch, hidden = out.shape
    shapes = [(steps, batch, 4 * hidden), (batch, hidden), (batch, hidden), (hidden, 4 * hidden)]
    outs = [mod.Array(int(np.prod(s))) for s in shapes]
    args = [_buf(mod, a) for a in (d_out, dh, dc, act, out, h0, c0, w)]
    mod.lstm_layer_bwd(*args, batch, hidden, steps, *outs)
    return [_read(mod, o, s) for o, s in zip(outs, shapes)]


def _composed(mod, xw, h0, c0, w, grads):
    """The per-step composition on ``mod`` (matmul, add, lstm_cell_fwd; lstm_cell_bwd, matmul):
    forward (out, h, c, act) and backward (dxw, dh0, dc0, dw_hh)."""
    steps, batch, hidden = xw.shape[0], h0.shape[0], h0.shape[1]
    n, n4 = batch * hidden, 4 * batch * hidden

    def matmul(a, b):
        out = mod.Array(a.shape[0] * b.shape[1])
        mod.matmul(_buf(mod, a), _buf(mod, b), out, a.shape[0], a.shape[1], b.shape[1])
        return _read(mod, out, (a.shape[0], b.shape[1]))

    h, c = h0, c0
    outs, acts, cs, tanhs = [], [], [], []
    for t in range(steps):
        gates = matmul(h, w) + xw[t]
        bufs = [mod.Array(k) for k in (n, n, n4, n)]
        mod.lstm_cell_fwd(_buf(mod, gates), _buf(mod, c), batch, hidden, *bufs)
        shapes = [h0.shape, h0.shape, (batch, 4 * hidden), h0.shape]
        h, c, act, tanh_c = (_read(mod, b, s) for b, s in zip(bufs, shapes))
        outs.append(h)
        acts.append(act)
        cs.append(c)
        tanhs.append(tanh_c)
    d_out, dh, dc = grads
    dxw = np.zeros(xw.shape, F32)
    for t in reversed(range(steps)):
        c_prev = cs[t - 1] if t else c0
        dg, dcp = mod.Array(n4), mod.Array(n)
        args = [_buf(mod, a) for a in (dh + d_out[t], dc, acts[t], c_prev, tanhs[t])]
        mod.lstm_cell_bwd(*args, batch, hidden, dg, dcp)
        dxw[t], dc = _read(mod, dg, (batch, 4 * hidden)), _read(mod, dcp, h0.shape)
        dh = matmul(dxw[t], np.ascontiguousarray(w.T))
    h_prev = np.stack([h0] + outs[:-1]).reshape(-1, hidden)
    dw = matmul(np.ascontiguousarray(h_prev.T), dxw.reshape(-1, 4 * hidden))
    forward = (np.stack(outs), h, c, np.stack(acts))
    return forward, (dxw, dh, dc, dw)


def _close(got, want, what, rtol=1e-5, atol=1e-5):
    for name, g, e in zip(what, got, want):
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=name)


FWD_NAMES = ("out", "h", "c", "act")
BWD_NAMES = ("dxw", "dh0", "dc0", "dw_hh")


# ---- the kernels on every module ----------------------------------------------------------------
@pytest.mark.parametrize("dev", MODULES)
@pytest.mark.parametrize("steps, batch, hidden", SIZES)
def test_layer_kernels_match_the_per_step_composition_and_the_reference(dev, steps, batch, hidden):
    mod = dev.mod
    rng = np.random.default_rng(steps * 100 + batch * 10 + hidden)
    xw, h0, c0, w = _inputs(rng, steps, batch, hidden)
    grads = (
        rng.standard_normal((steps, batch, hidden)).astype(F32),
        rng.standard_normal((batch, hidden)).astype(F32),
        rng.standard_normal((batch, hidden)).astype(F32),
    )
    forward = _fwd(mod, xw, h0, c0, w)
    backward = _bwd(mod, grads, (forward[3], forward[0]), h0, c0, w)
    _close(forward, layer64(xw, h0, c0, w), FWD_NAMES, rtol=1e-4, atol=1e-5)
    want_fwd, want_bwd = _composed(mod, xw, h0, c0, w, grads)
    _close(forward, want_fwd, FWD_NAMES)
    _close(backward, want_bwd, BWD_NAMES, rtol=1e-4, atol=1e-4)
    # the CPU modules do the loop's own arithmetic (the same products, the cell states
    # recomputed by the same function): bit for bit, but for numpy's dw_hh (a product of a
    # transposed view, whose BLAS call may sum in another order)
    exact = {"cpu": BWD_NAMES, "cpu_numpy": BWD_NAMES[:3]}.get(dev.name, ())
    for name, got, want in zip(FWD_NAMES + BWD_NAMES, forward + backward, want_fwd + want_bwd):
        if exact and (name in FWD_NAMES or name in exact):
            np.testing.assert_array_equal(got, want, err_msg=name)
    ref = nd.ndarray_backend_numpy
    ref_fwd = _fwd(ref, xw, h0, c0, w)
    _close(forward, ref_fwd, FWD_NAMES)
    ref_bwd = _bwd(ref, grads, (ref_fwd[3], ref_fwd[0]), h0, c0, w)
    _close(backward, ref_bwd, BWD_NAMES, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dev", MODULES)
@pytest.mark.parametrize("steps, batch, hidden", [(1, 1, 1), (3, 2, 3), (4, 1, 2)])
def test_layer_gradients_match_central_differences(dev, steps, batch, hidden):
    mod = dev.mod
    rng = np.random.default_rng(40 + steps)
    xw, h0, c0, w = _inputs(rng, steps, batch, hidden)
    cot = [rng.standard_normal(s) for s in ((steps, batch, hidden), h0.shape, h0.shape)]
    forward = _fwd(mod, xw, h0, c0, w)
    got = _bwd(mod, [g.astype(F32) for g in cot], (forward[3], forward[0]), h0, c0, w)
    args64 = [a.astype(np.float64) for a in (xw, h0, c0, w)]

    def objective(k):
        def f(v):
            a = list(args64)
            a[k] = v
            out, h, c = layer64(*a)[:3]
            return float((out * cot[0]).sum() + (h * cot[1]).sum() + (c * cot[2]).sum())

        return f

    for k, name in enumerate(("dxw", "dh0", "dc0", "dw_hh")):
        want = central_difference(objective(k), args64[k])
        np.testing.assert_allclose(got[k], want, rtol=1e-3, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("dev", MODULES)
@pytest.mark.parametrize("steps, batch, hidden", [(0, 2, 3), (3, 0, 2), (2, 3, 0), (0, 0, 0)])
def test_layer_kernels_on_empty_sizes(dev, steps, batch, hidden):
    """No steps: h, c are h0, c0 and every gradient but dh0, dc0 (= dh, dc) is zero; an empty
    batch or state: empty outputs and a zero weight gradient."""
    mod = dev.mod
    rng = np.random.default_rng(5)
    xw, h0, c0, w = _inputs(rng, steps, batch, hidden)
    out, h, c, act = _fwd(mod, xw, h0, c0, w)
    np.testing.assert_array_equal(h, h0)
    np.testing.assert_array_equal(c, c0)
    dh, dc = rng.standard_normal((2, batch, hidden)).astype(F32)
    d_out = np.ones((steps, batch, hidden), F32)
    dxw, dh0, dc0, dw = _bwd(mod, (d_out, dh, dc), (act, out), h0, c0, w)
    assert dxw.shape == xw.shape and dw.shape == w.shape
    np.testing.assert_array_equal(dw, np.zeros_like(w))
    if steps == 0:
        np.testing.assert_array_equal(dh0, dh)
        np.testing.assert_array_equal(dc0, dc)


def _layer_buffers(mod, steps, batch, hidden, wrong=None, delta=1):
    """Buffers of the right sizes for both kernels (name -> Array), ``wrong`` one ``delta``
    elements off."""
    n, seq = batch * hidden, steps * batch * hidden
    sizes = {"xw": 4 * seq, "h0": n, "c0": n, "w_hh": 4 * hidden * hidden, "out": seq, "h": n}
    sizes.update(c=n, act=4 * seq, d_out=seq, dh=n, dc=n, dxw=4 * seq, dh0=n)
    sizes.update(dc0=n, dw_hh=4 * hidden * hidden)
    bufs = {k: mod.Array(v + delta * (k == wrong)) for k, v in sizes.items()}
    for buf in bufs.values():
        mod.fill(buf, 0.5)
    return bufs


FWD_ARGS = (("xw", "h0", "c0", "w_hh"), ("out", "h", "c", "act"))
BWD_ARGS = (
    ("d_out", "dh", "dc", "act", "out", "h0", "c0", "w_hh"),
    ("dxw", "dh0", "dc0", "dw_hh"),
)


def _call(mod, fn, bufs, sizes):
    inputs, outputs = FWD_ARGS if fn == "lstm_layer_fwd" else BWD_ARGS
    getattr(mod, fn)(*(bufs[k] for k in inputs), *sizes, *(bufs[k] for k in outputs))


@pytest.mark.parametrize("dev", MODULES)
@pytest.mark.parametrize("fn", ["lstm_layer_fwd", "lstm_layer_bwd"])
def test_layer_kernels_name_each_wrongly_sized_buffer(dev, fn):
    mod = dev.mod
    _call(mod, fn, _layer_buffers(mod, 3, 2, 4), (2, 4, 3))  # the right sizes pass
    inputs, outputs = FWD_ARGS if fn == "lstm_layer_fwd" else BWD_ARGS
    for name in inputs + outputs:
        for delta in (-1, 1):
            with pytest.raises(ValueError, match=f"{fn}: {name} has"):
                _call(mod, fn, _layer_buffers(mod, 3, 2, 4, name, delta), (2, 4, 3))


@pytest.mark.parametrize("dev", MODULES)
@pytest.mark.parametrize("fn", ["lstm_layer_fwd", "lstm_layer_bwd"])
def test_layer_kernels_reject_hostile_sizes_and_kinds(dev, fn):
    mod = dev.mod
    bufs = _layer_buffers(mod, 3, 2, 4)
    for sizes in ((-1, 4, 3), (2, -4, 3), (2, 4, -3), (2**40, 2**40, 3), (2, 2**30, 2**30)):
        with pytest.raises(ValueError, match=fn):
            _call(mod, fn, bufs, sizes)
    for sizes in ((2.0, 4, 3), (2, "4", 3), (2, 4, None)):
        with pytest.raises(TypeError):
            _call(mod, fn, bufs, sizes)
    inputs, outputs = FWD_ARGS if fn == "lstm_layer_fwd" else BWD_ARGS
    for name in (inputs[0], outputs[-1]):
        for bad in (None, [0.0] * 24):
            with pytest.raises(TypeError):
                _call(mod, fn, {**bufs, name: bad}, (2, 4, 3))


# ---- the array-level functions ------------------------------------------------------------------
@pytest.mark.parametrize("dev", [p for p in MODULES if p.id != "cuda"])
def test_array_functions_name_a_wrong_shape(dev):
    fns = nd

    def make(a):
        return nd.array(np.asarray(a, F32), device=dev)

    xw, h0, w = np.zeros((3, 2, 8)), np.zeros((2, 2)), np.zeros((2, 8))
    out, h, c, act = fns.lstm_layer_fwd(make(xw), make(h0), make(h0), make(w), 3)
    assert out.shape == (3, 2, 2) and act.shape == (3, 2, 8) and c.shape == (2, 2)
    cases = {
        "xw": (np.zeros((3, 2, 7)), h0, h0, w, 3),
        "h0": (xw, np.zeros((2, 3)), h0, w, 3),
        "w_hh": (xw, h0, h0, np.zeros((8, 2)), 3),
    }
    for name, (a, b, cc, ww, steps) in cases.items():
        with pytest.raises(ValueError, match=f"lstm_layer_fwd: {name} must"):
            fns.lstm_layer_fwd(make(a), make(b), make(cc), make(ww), steps)
    with pytest.raises(ValueError, match="lstm_layer_fwd: xw must"):  # steps disagree with xw
        fns.lstm_layer_fwd(make(xw), make(h0), make(h0), make(w), 4)
    with pytest.raises(ValueError, match="steps must be >= 0"):
        fns.lstm_layer_fwd(make(xw), make(h0), make(h0), make(w), -1)
    grads = [make(np.zeros((3, 2, 2))), make(h0), make(h0)]
    with pytest.raises(ValueError, match="lstm_layer_bwd: act must"):
        fns.lstm_layer_bwd(*grads, out, out, make(h0), make(h0), make(w), 3)


# ---- the op -------------------------------------------------------------------------------------


@pytest.mark.nn
@pytest.mark.both_backends
@pytest.mark.parametrize("device", DEVICES)
def test_an_lstm_layer_is_one_kernel_call_each_way(device, monkeypatch):
    """needle.fast's LSTM: one lstm_layer_fwd per layer, one lstm_layer_bwd per layer in
    backward, and (on the device modules) no per-step cell kernel from Python."""
    import needle.fast

    names = ("lstm_layer_fwd", "lstm_layer_bwd")
    if ndl.BACKEND == "nd":  # the numpy kernels' reference loop calls the cell kernels itself
        names += ("lstm_cell_fwd", "lstm_cell_bwd")
    counts = _count_kernel_calls(device, monkeypatch, names)
    model = needle.fast.fuse(nn.LSTM(3, 4, num_layers=2, device=device))
    x = float32_tensor(np.random.default_rng(1).standard_normal((6, 2, 3)), device)
    out, (h, c) = model(x)
    assert counts == {**dict.fromkeys(names, 0), "lstm_layer_fwd": 2}
    (out.sum() + c.sum()).backward()
    assert counts == {**dict.fromkeys(names, 0), "lstm_layer_fwd": 2, "lstm_layer_bwd": 2}
