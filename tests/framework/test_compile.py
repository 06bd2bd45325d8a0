"""ndl.compile: a captured training step replays the eager step's kernels exactly.

Oracles: the same step run eagerly on a twin model (same seed, same data, same dropout draws),
and numpy for a linear model trained by SGD. Every course model family (MLP-ResNet, a small
ResNet-style conv net, an LSTM LM, a Transformer LM) is trained 100 steps with SGD and Adam;
the fallback tests change what a replay must not ignore (shapes, devices, a Python branch, the
learning rate, a device value read by Python) and check the step re-traces and stays exact.
"""

from __future__ import annotations

import numpy as np
import pytest

import needle as ndl
import needle.fast as fast
import needle.nn as nn
from companion.apps.language_model import LanguageModel
from companion.apps.models import ConvBN
from needle import backend_selection
from needle.fast import CaptureWarning

pytestmark = pytest.mark.skipif(
    backend_selection.BACKEND != "nd", reason="capture records the nd backend's device calls"
)

DEVICES = [
    ndl.cpu(),
    ndl.cpu_numpy(),
    pytest.param(
        ndl.cuda(), marks=pytest.mark.skipif(not ndl.cuda().enabled(), reason="no CUDA device")
    ),
]
DEVICE_IDS = ["cpu", "cpu_numpy", "cuda"]
VOCAB, SEQ, BATCH = 12, 5, 3


def _model(case: str, device):
    """A small model of the course family ``case``, fused (``needle.fast.fuse``: compile is
    the fast path's tool, and the course's SoftmaxLoss and attention read values into Python,
    which a replay cannot follow), and a function drawing one batch (x, y)."""
    if case == "mlp_resnet":
        model = nn.Sequential(
            nn.Linear(10, 16, device=device),
            nn.ReLU(),
            nn.Residual(
                nn.Sequential(
                    nn.Linear(16, 8, device=device),
                    nn.BatchNorm1d(8, device=device),
                    nn.ReLU(),
                    nn.Dropout(0.2),
                    nn.Linear(8, 16, device=device),
                    nn.BatchNorm1d(16, device=device),
                )
            ),
            nn.ReLU(),
            nn.Linear(16, 4, device=device),
        )

        def batch(rng):
            return rng.randn(6, 10), rng.randint(0, 4, 6)

    elif case == "convnet":  # ResNet-9's blocks on 8x8 images
        model = nn.Sequential(
            ConvBN(3, 4, 3, 2, device=device),
            nn.Residual(nn.Sequential(ConvBN(4, 4, 3, 1, device=device))),
            ConvBN(4, 8, 3, 2, device=device),
            nn.Flatten(),
            nn.Linear(8 * 2 * 2, 5, device=device),
        )

        def batch(rng):
            return rng.randn(2, 3, 8, 8), rng.randint(0, 5, 2)

    else:
        kw = {"num_head": 2, "dim_head": 4, "dropout": 0.1} if case == "transformer_lm" else {}
        seq = "lstm" if case == "lstm_lm" else "transformer"
        model = LanguageModel(8, VOCAB, 8, 2, seq, seq_len=SEQ, device=device, **kw)

        def batch(rng):
            return rng.randint(0, VOCAB, (SEQ, BATCH)), rng.randint(0, VOCAB, SEQ * BATCH)

    return fast.fuse(model), batch


def _training(case: str, device, opt_name: str, lr: float = 0.05):
    """(model, step function) with a fixed initialisation."""
    np.random.seed(0)
    model, _ = _model(case, device)
    opt_cls = ndl.optim.SGD if opt_name == "sgd" else ndl.optim.Adam
    opt = opt_cls(model.parameters(), lr=lr if opt_name == "sgd" else lr / 10, weight_decay=1e-3)
    loss_fn = fast.fuse(nn.SoftmaxLoss())

    def step(x, y):
        opt.reset_grad()
        out = model(x)
        if isinstance(out, tuple):
            out = out[0]
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        return loss

    return model, step


def _tensors(x, y, device):
    return (
        ndl.Tensor(np.asarray(x, dtype=np.float32), device=device),
        ndl.Tensor(np.asarray(y, dtype=np.float32), device=device),
    )


def _run_both(eager, compiled, batches, device, seeds=None):
    """Losses of the eager and the compiled step on ``batches``, reseeding numpy before each
    call so both draw the same dropout masks."""
    losses = []
    for i, (x, y) in enumerate(batches):
        np.random.seed(1000 + i if seeds is None else seeds[i])
        a = eager(*_tensors(x, y, device)).numpy()
        np.random.seed(1000 + i if seeds is None else seeds[i])
        b = compiled(*_tensors(x, y, device)).numpy()
        losses.append((a, b))
    return losses


def _assert_same_params(m1, m2):
    for p, q in zip(m1.parameters(), m2.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


CASES = ["mlp_resnet", "convnet", "lstm_lm", "transformer_lm"]


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("device", DEVICES, ids=DEVICE_IDS)
def test_hundred_steps_match_eager(case, opt_name, device):
    steps = 100
    m1, eager = _training(case, device, opt_name)
    m2, step = _training(case, device, opt_name)
    compiled = ndl.compile(step)
    _, batch = _model(case, device)
    rng = np.random.RandomState(7)
    batches = [batch(rng) for _ in range(steps)]
    losses = _run_both(eager, compiled, batches, device)
    for i, (a, b) in enumerate(losses):
        assert np.array_equal(a, b), f"step {i}: eager loss {a} != compiled {b}"
    _assert_same_params(m1, m2)
    _buffers_equal(m1, m2)  # the running statistics (carried state) follow too
    assert compiled.stats["replays"] >= steps - 4, compiled.stats
    assert len({float(b) for _, b in losses}) > steps // 2  # the replays did train


def _buffers_equal(m1, m2):
    for a, b in zip(_buffers(m1), _buffers(m2)):
        np.testing.assert_array_equal(a, b)


def _buffers(model):
    out = []
    for m in _modules(model):
        for name in ("running_mean", "running_var"):
            if hasattr(m, name):
                out.append(getattr(m, name).numpy())
    return out


def _modules(model):
    seen, stack = [], [model]
    while stack:
        m = stack.pop()
        seen.append(m)
        stack.extend(m._children())
    return seen


def test_linear_regression_matches_numpy():
    """A linear model trained by plain SGD: the compiled step against numpy's formulas."""
    device = ndl.cpu()
    rng = np.random.RandomState(0)
    w0 = rng.randn(4, 1).astype(np.float32)
    w = ndl.Tensor(w0, device=device, requires_grad=True)
    lr = 0.1

    def step(x, y):
        w.grad = None
        loss = ((x @ w - y) ** 2).sum() / x.shape[0]
        loss.backward()
        w.data = w.data - lr * w.grad.data
        return loss

    compiled = ndl.compile(step, watch=[w])
    wn = w0.astype(np.float64)
    for _ in range(100):
        x, y = rng.randn(8, 4).astype(np.float32), rng.randn(8, 1).astype(np.float32)
        loss = compiled(ndl.Tensor(x, device=device), ndl.Tensor(y, device=device))
        r = x @ wn - y
        np.testing.assert_allclose(loss.numpy(), (r**2).sum() / 8, rtol=1e-4)
        wn = wn - lr * (2 * x.T @ r / 8)
    np.testing.assert_allclose(w.numpy(), wn, rtol=1e-4, atol=1e-5)
    # ``w.data = ...`` rebinds w's array every call: carried state, not a reason to stay eager
    assert compiled.stats["replays"] >= 90, compiled.stats


def _pair(case="mlp_resnet", opt_name="sgd", device=None):
    device = device or ndl.cpu()
    m1, eager = _training(case, device, opt_name)
    m2, step = _training(case, device, opt_name)
    return m1, eager, m2, step, device


def test_new_shape_traces_a_new_program_and_both_replay():
    m1, eager, m2, step, device = _pair()
    compiled = ndl.compile(step)
    rng = np.random.RandomState(3)
    sizes = [6] * 5 + [4] * 5 + [6] * 3 + [4] * 3
    batches = [(rng.randn(n, 10), rng.randint(0, 4, n)) for n in sizes]
    for a, b in _run_both(eager, compiled, batches, device):
        assert np.array_equal(a, b)
    _assert_same_params(m1, m2)
    # each signature is traced twice, then replayed (the parameters and batch norm's running
    # averages are rebound by every call, and the entries holding them before and after both
    # traced calls show it is carried state); back on the first shape, its program reads the
    # parameters and running averages from the Tensors the other program left
    assert compiled.stats["traces"] == 4 and compiled.stats["replays"] == 12, compiled.stats
    assert compiled.stats["retraces"] == 0, compiled.stats
    _buffers_equal(m1, m2)


def test_what_held_the_old_state_keeps_it_as_after_the_eager_step():
    """The optimizers give each parameter a new array (the course's ``p.data = ...``) and
    batch norm makes new running averages: a replay does the same, so a snapshot
    ``Tensor(p)`` and a running average held from before the call keep their values, as after
    the eager twin's step (a replay that wrote the new values into the old arrays would change
    them), and each parameter stays the same Tensor."""
    m1, eager, m2, step, device = _pair()
    compiled = ndl.compile(step)
    rng = np.random.RandomState(5)
    for i in range(8):
        x, y = rng.randn(6, 10), rng.randint(0, 4, 6)
        held = []
        for m, f in ((m1, eager), (m2, compiled)):
            params = list(m.parameters())
            snaps = [ndl.Tensor(p) for p in params]
            stats = [b.running_mean for b in _modules(m) if hasattr(b, "running_mean")]
            np.random.seed(i)
            f(*_tensors(x, y, device))
            assert all(p is q for p, q in zip(params, m.parameters()))
            held.append([t.numpy() for t in snaps + stats])
        for a, b in zip(*held):
            np.testing.assert_array_equal(a, b, err_msg=f"call {i}")
    _assert_same_params(m1, m2)
    _buffers_equal(m1, m2)
    assert compiled.stats["replays"] >= 5, compiled.stats


def test_new_device_is_a_new_signature():
    device = ndl.cpu()
    w = ndl.Tensor(np.ones((3, 2), np.float32), device=device)

    def f(x):
        return ndl.relu(x @ w)

    compiled = ndl.compile(f)
    x = np.random.RandomState(0).randn(4, 3).astype(np.float32)
    for _ in range(4):
        compiled(ndl.Tensor(x, device=device))
    assert compiled.stats["replays"] == 2
    # an input on another device: not replayed with cpu() buffers (eager raises as eager does)
    with pytest.raises(ValueError, match="different devices"):
        compiled(ndl.Tensor(x, device=ndl.cpu_numpy()))
    assert compiled.stats["replays"] == 2


def test_python_branch_change_retraces():
    m1, eager, m2, step, device = _pair()
    flags = {"extra": False}

    def step2(x, y):  # a branch on a closure value; eager twin reads the same flag
        loss = step(x, y)
        return loss * 2 if flags["extra"] else loss

    def eager2(x, y):
        loss = eager(x, y)
        return loss * 2 if flags["extra"] else loss

    compiled = ndl.compile(step2)
    rng = np.random.RandomState(4)
    batches = [(rng.randn(6, 10), rng.randint(0, 4, 6)) for _ in range(12)]
    results = []
    for i in range(12):
        flags["extra"] = i >= 6
        results += _run_both(eager2, compiled, batches[i : i + 1], device, seeds=[i])
    for a, b in results:
        assert np.array_equal(a, b)
    _assert_same_params(m1, m2)
    assert compiled.stats["retraces"] == 1, compiled.stats


def test_learning_rate_change_retraces():
    m1, eager, m2, step, device = _pair(opt_name="adam")
    compiled = ndl.compile(step)
    opt1 = eager.__closure__[_cell(eager, "opt")].cell_contents
    opt2 = step.__closure__[_cell(step, "opt")].cell_contents
    rng = np.random.RandomState(5)
    batches = [(rng.randn(6, 10), rng.randint(0, 4, 6)) for _ in range(14)]
    for i in range(14):
        if i == 7:  # a schedule changes the Python float lr between steps
            opt1.lr = opt2.lr = 0.001
        for a, b in _run_both(eager, compiled, batches[i : i + 1], device, seeds=[i]):
            assert np.array_equal(a, b), i
    _assert_same_params(m1, m2)
    assert compiled.stats["retraces"] == 1, compiled.stats
    assert opt1.t == opt2.t == 14  # Adam's step counter advanced by the replays too


def _cell(fn, name):
    return fn.__code__.co_freevars.index(name)


def test_branch_on_device_value_is_guarded():
    """A Python branch on a value read from the device: the replay reads it again and
    re-traces when it differs, so the other branch is never replayed by mistake (the guard
    compares the value read, so a read of a value that changes every call never replays)."""
    device = ndl.cpu()
    w = ndl.Tensor(np.full((3, 1), 0.5, np.float32), device=device)

    def f(x):
        s = x @ w
        if float(s.sum().numpy()) > 0:
            return s * 2
        return s - 1

    compiled = ndl.compile(f)
    rng = np.random.RandomState(0)
    xa, xb = rng.rand(2, 3).astype(np.float32), -rng.rand(2, 3).astype(np.float32)
    for i in range(12):
        x = xa if i < 6 else xb
        got = compiled(ndl.Tensor(x, device=device)).numpy()
        np.testing.assert_array_equal(got, f(ndl.Tensor(x, device=device)).numpy())
    assert compiled.stats["replays"] == 8 and compiled.stats["retraces"] == 1, compiled.stats


def test_value_read_after_the_update_stays_eager():
    """Reading the loss in Python after the optimizer step: a replay could only check that
    value after writing the parameters, so the step is never replayed (and stays exact)."""
    m1, eager, m2, step, device = _pair()

    def step_float(x, y):
        return float(step(x, y).numpy())

    def eager_float(x, y):
        return float(eager(x, y).numpy())

    compiled = ndl.compile(step_float)
    rng = np.random.RandomState(8)
    with pytest.warns(CaptureWarning, match="after updating its state"):
        for i in range(8):
            x, y = rng.randn(6, 10), rng.randint(0, 4, 6)
            np.random.seed(i)
            a = eager_float(*_tensors(x, y, device))
            np.random.seed(i)
            assert compiled(*_tensors(x, y, device)) == a
    _assert_same_params(m1, m2)
    assert compiled.stats["replays"] == 0, compiled.stats
    assert any("after updating its state" in r for r in compiled.stats["reasons"])


def test_dropout_draws_fresh_masks():
    device = ndl.cpu()
    x = ndl.Tensor(np.ones((4, 50), np.float32), device=device)
    drop = nn.Dropout(0.5)
    compiled = ndl.compile(lambda t: drop(t))
    np.random.seed(0)
    outs = [compiled(x).numpy() for _ in range(6)]
    assert compiled.stats["replays"] == 4  # two traced calls agreed, then replays
    np.random.seed(0)
    expected = [drop(x).numpy() for _ in range(6)]
    for a, b in zip(outs, expected):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(outs[4], outs[5])  # two replays, two masks


def test_replay_abandoned_after_a_draw_gives_the_draw_back():
    """A replay draws a random mask, then reads a device value that differs from the traced
    one: it is abandoned and the call runs eagerly, drawing what the eager step draws."""
    device = ndl.cpu()

    def f(x):
        s = x * ndl.init.rand(2, 3, device=device)
        if float(x.sum().numpy()) > 0:
            return s * 2
        return s - 1

    compiled = ndl.compile(f)
    rng = np.random.RandomState(0)
    xa, xb = rng.rand(2, 3).astype(np.float32), -rng.rand(2, 3).astype(np.float32)
    for i in range(10):
        x = xa if i < 5 else xb
        np.random.seed(i)
        got = compiled(ndl.Tensor(x, device=device)).numpy()
        np.random.seed(i)
        np.testing.assert_array_equal(got, f(ndl.Tensor(x, device=device)).numpy(), f"call {i}")
    assert compiled.stats["retraces"] == 1 and compiled.stats["replays"] == 6, compiled.stats


def test_outputs_are_fresh_and_grads_follow():
    m1, eager, m2, step, device = _pair()
    compiled = ndl.compile(step)
    rng = np.random.RandomState(6)
    batches = [(rng.randn(6, 10), rng.randint(0, 4, 6)) for _ in range(6)]
    kept = []
    for i, (x, y) in enumerate(batches):
        np.random.seed(i)
        e = eager(*_tensors(x, y, device)).numpy()
        np.random.seed(i)
        kept.append((e, compiled(*_tensors(x, y, device))))
    for e, c in kept:  # a loss returned earlier is not overwritten by later replays
        np.testing.assert_array_equal(e, c.numpy())
    for p, q in zip(m1.parameters(), m2.parameters()):  # p.grad holds this step's gradient
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())


def test_memory_plan_reuses_buffers():
    device = ndl.cpu()
    np.random.seed(0)
    model = nn.Sequential(
        *[nn.Sequential(nn.Linear(32, 32, device=device), nn.ReLU())] * 1,
        *[nn.Sequential(nn.Linear(32, 32, device=device), nn.Tanh()) for _ in range(6)],
    )
    opt = ndl.optim.SGD(model.parameters(), lr=0.01)

    def step(x):
        opt.reset_grad()
        loss = model(x).sum()
        loss.backward(create_graph=False)
        opt.step()
        return loss

    compiled = ndl.compile(step)
    x = ndl.Tensor(np.random.randn(64, 32).astype(np.float32), device=device)
    mod = device.mod
    peaks = []
    for _ in range(5):
        mod.reset_peak()
        before = mod.memory_stats()["live_bytes"]
        compiled(x)
        peaks.append(mod.memory_stats()["peak_bytes"] - before)
    plan = compiled.memory_plan()
    assert plan["pool_buffers"] < plan["temporaries"], plan
    assert plan["pool_bytes"] < plan["temporary_bytes"], plan
    # the returned loss is copied out of a pooled buffer: Python does not hold that buffer
    out = compiled.program.outputs
    assert out[0] == "tensor" and compiled.program.slots[out[1]][0] == "pool", out
    # the replays (calls 4 and 5) allocate only the returned loss; the traced calls far more
    assert peaks[-1] < peaks[1] / 4, peaks


def test_gives_up_on_a_step_whose_kernels_keep_changing():
    device = ndl.cpu()
    calls = []

    def f(x):
        calls.append(1)
        for _ in range(len(calls)):
            x = x + 1
        return x

    compiled = ndl.compile(f, max_traces=3)
    x = ndl.Tensor(np.zeros(3, np.float32), device=device)
    with pytest.warns(CaptureWarning, match="device calls"):
        for n in range(1, 8):
            np.testing.assert_array_equal(compiled(x).numpy(), np.full(3, n, np.float32))
    assert compiled.stats["replays"] == 0 and compiled.stats["eager"] > 0, compiled.stats


def test_python_side_effect_is_never_skipped():
    """A step that changes Python state a replay cannot change (it appends to a list, flips a
    flag): never replayed, so every call runs the side effect exactly once."""
    device = ndl.cpu()
    history = []
    state = {"flag": False}

    def f(t):
        history.append(len(history))
        return t * 2

    def g(t):
        state["flag"] = not state["flag"]
        return t * 2

    x = ndl.Tensor(np.ones(2, np.float32), device=device)
    for fn, check in (
        (f, lambda n: history == list(range(n))),
        (g, lambda n: state["flag"] == n % 2),
    ):
        compiled = ndl.compile(fn, max_traces=3)
        with pytest.warns(CaptureWarning, match="cannot repeat"):
            for n in range(1, 10):
                np.testing.assert_array_equal(compiled(x).numpy(), np.full(2, 2, np.float32))
                assert check(n), n
        assert compiled.stats["replays"] == 0, compiled.stats
        assert any("cannot repeat" in r for r in compiled.stats["reasons"]), compiled.stats


def test_gives_up_when_every_program_fails_its_guard_at_once():
    """The caller changes what the step reads every third call: each program replays once and
    then fails its guard; after max_traces such programs the step runs eagerly (still exact)."""
    device = ndl.cpu()
    scale = {"v": 1.0}

    def f(t):
        return t * scale["v"]

    compiled = ndl.compile(f, max_traces=3)
    x = ndl.Tensor(np.ones(2, np.float32), device=device)
    with pytest.warns(CaptureWarning, match="failed their guard"):
        for n in range(18):
            scale["v"] = float(n // 3)
            np.testing.assert_array_equal(compiled(x).numpy(), np.full(2, n // 3, np.float32))
    assert compiled.stats["replays"] == 3 and compiled.stats["retraces"] == 3, compiled.stats
    assert any("failed their guard" in r for r in compiled.stats["reasons"]), compiled.stats


def test_bad_arguments():
    with pytest.raises(TypeError, match="needs a function"):
        ndl.compile(3)
    with pytest.raises(ValueError, match="max_traces"):
        ndl.compile(lambda: None, max_traces=1)
    compiled = ndl.compile(lambda x: x)
    arr = np.zeros(2)
    assert compiled(arr) is arr  # an argument it cannot guard: eager, with the reason noted
    assert "cannot be guarded" in compiled.stats["reasons"][0]


def test_unsupported_result_runs_once_and_stays_eager():
    calls = []
    x = ndl.Tensor(np.ones(3, np.float32), device=ndl.cpu())

    def f(t):
        calls.append(1)
        return {"out": t + 1}

    compiled = ndl.compile(f)
    with pytest.warns(CaptureWarning, match="returned a dict"):
        for n in range(1, 4):
            np.testing.assert_array_equal(compiled(x)["out"].numpy(), np.full(3, 2, np.float32))
            assert len(calls) == n  # the step ran once per call, never again to fall back
    assert compiled.stats["replays"] == 0 and "returned a dict" in compiled.stats["reasons"][0]


def test_the_table_of_written_buffers_names_real_parameters():
    # The table is derived from the fused kernels' specifications; each name it lists must be a
    # parameter of the device function (else the replay planner would miss a write).
    from needle.backend_ndarray import protocol
    from needle.fast import recording

    assert {"sgd_update", "adam_update", "conv_fwd", "softmax_fwd"} <= set(recording.WRITES)
    for name, written in recording.WRITES.items():
        assert hasattr(protocol.DeviceModule, name) or name in protocol.COURSE_PARAMS, name
        params = recording.param_names(name)
        assert written and set(written) <= set(params), (name, written, params)
