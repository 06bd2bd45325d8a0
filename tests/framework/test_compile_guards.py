"""ndl.compile replays only a step it can prove unchanged: state a replay must not ignore.

Each case builds an eager and a compiled twin and changes something between calls (a plain
config object's attribute, a frozen parameter, a branch on a counter, a numpy array held by a
module, a replaced forward, gradients reset outside the step, calls from two threads): the
compiled twin must re-trace or refuse, staying bit-identical to the eager one, and recording
must never outlive its block.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import types

import numpy as np
import pytest

import needle as ndl
import needle.nn as nn
from needle import backend_selection
from needle.fast import CaptureWarning

pytestmark = pytest.mark.skipif(
    backend_selection.BACKEND != "nd", reason="capture records the nd backend's device calls"
)


# ---- state a replay must not ignore (each case: eager and compiled twins stay bit-identical) --
_X = np.random.RandomState(1).randn(5, 4).astype(np.float32)
_Y = np.array([0, 1, 2, 0, 1], np.float32)
_IT = 0  # a global step counter read by a step (test_branch_on_a_counter_is_not_frozen)


def _twins(make_step, change, steps=10, reset_outside=False):
    """Train a Linear twice (eagerly, then compiled) from one seed, calling ``change(i, ctx)``
    before call i; returns the weights of both, the gradients each call left in ``p.grad``,
    and the compiled step (for its stats)."""
    global _IT
    runs = []
    for compiled in (False, True):
        _IT = 0
        np.random.seed(0)
        m = nn.Linear(4, 3, device=ndl.cpu())
        opt = ndl.optim.SGD(m.parameters(), lr=0.1)
        ctx = types.SimpleNamespace(m=m, opt=opt)
        step = make_step(ctx)
        f = ndl.compile(step) if compiled else step
        grads = []
        for i in range(steps):
            change(i, ctx)
            f(ndl.Tensor(_X, device=ndl.cpu()), ndl.Tensor(_Y, device=ndl.cpu()))
            grads.append([None if p.grad is None else p.grad.numpy() for p in m.parameters()])
            if reset_outside:
                opt.reset_grad()
        runs.append(([p.numpy() for p in m.parameters()], grads, f))
    (w_eager, g_eager, _), (w_comp, g_comp, f) = runs
    for a, b in zip(w_eager, w_comp):
        np.testing.assert_array_equal(a, b)
    return g_eager, g_comp, f


def _loss_step(ctx, scale=lambda ctx: 1.0, reset=True):
    def step(x, y):
        if reset:
            ctx.opt.reset_grad()
        loss = nn.SoftmaxLoss()(ctx.m(x), y) * scale(ctx)
        loss.backward()
        ctx.opt.step()
        return loss

    return step


@dataclasses.dataclass
class _Config:
    scale: float = 1.0


@pytest.mark.parametrize("kind", ["namespace", "dataclass"])
def test_plain_config_attribute_is_guarded(kind):
    """an attribute of a plain object the step names (a config) changes between calls."""

    def make(ctx):
        ctx.cfg = types.SimpleNamespace(scale=1.0) if kind == "namespace" else _Config()
        cfg = ctx.cfg
        return _loss_step(ctx, scale=lambda _: cfg.scale)

    def change(i, ctx):
        if i == 5:
            ctx.cfg.scale = 10.0

    _, _, f = _twins(make, change)
    assert f.stats["replays"] > 0 and f.stats["retraces"] >= 1, f.stats


def test_scheduler_attribute_copied_into_the_optimizer_is_guarded():
    """a scheduler object's ``lr`` copied into ``opt.lr`` inside the step."""

    class Schedule:
        def __init__(self):
            self.lr = 0.1

    def make(ctx):
        sched = ctx.sched = Schedule()
        inner = _loss_step(ctx)

        def step(x, y):
            ctx.opt.lr = sched.lr
            return inner(x, y)

        return step

    def change(i, ctx):
        if i == 5:
            ctx.sched.lr = 0.01

    _, _, f = _twins(make, change, steps=12)
    assert f.stats["replays"] > 0, f.stats


def test_freezing_a_parameter_is_guarded():
    """``p.requires_grad = False`` after capture: the frozen weight stops training."""

    def change(i, ctx):
        if i == 5:
            ctx.m.weight.requires_grad = False

    _, _, f = _twins(_loss_step, change)
    assert f.stats["replays"] > 0 and f.stats["retraces"] >= 1, f.stats


@pytest.mark.parametrize("where", ["module", "global"])
def test_branch_on_a_counter_is_not_frozen(where):
    """a Python branch on a step counter the step advances (a module attribute or a
    global): a replay would advance the counter but keep the branch it traced."""

    def make(ctx):
        ctx.m.steps = 0

        def scale(c):
            global _IT
            if where == "module":
                c.m.steps += 1
                n = c.m.steps
            else:
                _IT += 1
                n = _IT
            return 2.0 if n > 6 else 1.0

        return _loss_step(ctx, scale=scale)

    with pytest.warns(CaptureWarning, match="Linear.steps" if where == "module" else "'_IT'"):
        _, _, f = _twins(make, lambda i, ctx: None)
    assert f.stats["replays"] == 0, f.stats
    assert any("steps" in r or "_IT" in r for r in f.stats["reasons"]), f.stats


def test_numpy_array_held_by_a_module_changed_in_place_is_guarded():
    """a numpy array a module holds (a class weighting) is changed in place."""

    def make(ctx):
        ctx.m.weighting = np.ones(3, np.float32)
        m = ctx.m

        def step(x, y):
            ctx.opt.reset_grad()
            out = m(x) * ndl.Tensor(m.weighting, device=ndl.cpu())
            loss = nn.SoftmaxLoss()(out, y)
            loss.backward()
            ctx.opt.step()
            return loss

        return step

    def change(i, ctx):
        if i == 5:
            ctx.m.weighting[0] = 3.0

    _, _, f = _twins(make, change)
    assert f.stats["replays"] > 0 and f.stats["retraces"] >= 1, f.stats


def test_forward_assigned_on_an_instance_is_guarded():
    """``module.forward = ...`` on the instance after capture."""

    def change(i, ctx):
        if i == 5:
            m = ctx.m
            ctx.m.forward = lambda x: nn.Linear.forward(m, x) * 2.0

    _, _, f = _twins(_loss_step, change)
    assert f.stats["replays"] > 0 and f.stats["retraces"] >= 1, f.stats


def test_grads_reset_outside_the_step_are_bound_after_a_replay():
    """``opt.reset_grad()`` after each call: after a replay ``p.grad`` holds the step's
    gradient (as after the eager step), not None."""
    g_eager, g_comp, f = _twins(
        lambda ctx: _loss_step(ctx, reset=False), lambda i, ctx: None, reset_outside=True
    )
    assert f.stats["replays"] > 0, f.stats
    for i, (a, b) in enumerate(zip(g_eager, g_comp)):
        for ga, gb in zip(a, b):
            assert gb is not None, f"call {i}: p.grad is None after the compiled step"
            np.testing.assert_array_equal(ga, gb)


def test_one_compiled_step_called_from_two_threads():
    """each thread gets the result of its own input."""
    device = ndl.cpu()
    np.random.seed(0)
    m = nn.Sequential(
        nn.Linear(128, 128, device=device), nn.ReLU(), nn.Linear(128, 128, device=device)
    )
    m.eval()
    f = ndl.compile(lambda x: m(x) * 1.0)
    xs = [np.random.randn(64, 128).astype(np.float32) for _ in range(2)]
    expected = [m(ndl.Tensor(x, device=device)).numpy() for x in xs]
    for _ in range(3):
        f(ndl.Tensor(xs[0], device=device))
    wrong = [0, 0]

    def run(j):
        for _ in range(150):
            if not np.array_equal(f(ndl.Tensor(xs[j], device=device)).numpy(), expected[j]):
                wrong[j] += 1

    threads = [threading.Thread(target=run, args=(j,)) for j in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [0, 0]
    assert f.stats["replays"] >= 290, f.stats


def test_overlapping_traces_in_two_threads_leave_no_recorder():
    """two steps traced at the same time in two threads; afterwards every device calls
    its kernels directly again and plain ops keep nothing alive."""
    device = ndl.cpu()
    barrier = threading.Barrier(2, timeout=20)
    x = ndl.Tensor(np.ones((4, 4), np.float32), device=device)

    def step_a(t):
        barrier.wait()
        return t * 2

    def step_b(t):
        barrier.wait()
        time.sleep(0.3)  # still tracing when the main thread's trace ends
        return t + 1

    fa, fb = ndl.compile(step_a), ndl.compile(step_b)
    worker = threading.Thread(target=lambda: (time.sleep(0.2), fb(x)))  # starts after fa
    worker.start()
    np.testing.assert_array_equal(fa(x).numpy(), np.full((4, 4), 2, np.float32))
    worker.join()
    x0 = ndl.Tensor(np.ones((256, 256), np.float32), device=device)
    y = (x0 @ x0) * 0.5
    live = device.mod.memory_stats()["live_bytes"]
    for _ in range(20):
        y = (x0 @ x0) * 0.5
    assert device.mod.memory_stats()["live_bytes"] - live < 4 * 256 * 256 * 4
    del y
    from needle.backend_ndarray import protocol

    for dev in (ndl.cpu(), ndl.cpu_numpy()):
        for name in vars(protocol.DeviceModule):
            if not name.startswith("_") and hasattr(dev.mod, name):
                assert getattr(dev, name) is getattr(dev.mod, name), (dev, name)


def test_recording_hook_reports_this_threads_calls_until_its_block_ends():
    """The device layer's hook: the innermost recorder of the calling thread gets each device
    call once (a draw as one ``rand``), other threads are not reported, and an exception ends
    the block; afterwards the devices call their modules directly again."""
    from needle.backend_ndarray import NDArray
    from needle.backend_ndarray.device import is_recording, recording

    class Log:
        def __init__(self):
            self.names = []

        def record(self, device, name, args, result):
            self.names.append((device.name, name))

    outer, inner = Log(), Log()
    a = NDArray(np.ones(4, np.float32), device=ndl.cpu())
    with pytest.raises(ZeroDivisionError):
        with recording(outer):
            b = a + 1
            worker = threading.Thread(target=lambda: a * 2)
            worker.start()
            worker.join()
            with recording(inner):
                ndl.cpu().rand(2, 3)
            assert is_recording()
            raise ZeroDivisionError("the block ends by an exception")
    assert outer.names == [("cpu", "Array"), ("cpu", "scalar_add")]
    calls = []  # keyword arguments reach the module, and are reported positionally
    rec = Log()
    rec.record = lambda device, name, args, result: calls.append((name, args))
    with recording(rec):
        out = NDArray.make((4,), device=ndl.cpu())
        ndl.cpu().fill(out=out.buffer[0], val=3.0)
    assert calls[-1] == ("fill", (out.buffer[0], 3.0))
    np.testing.assert_array_equal(out.numpy(), np.full(4, 3, np.float32))
    assert inner.names == [("cpu", "rand")]
    assert not is_recording()
    np.testing.assert_array_equal((b * 2).numpy(), np.full(4, 4, np.float32))
    assert len(outer.names) == 2
    assert ndl.cpu().ewise_scalar is ndl.cpu().mod.ewise_scalar


def test_gradients_accumulated_over_calls_and_reset_outside_every_third():
    """The step accumulates into ``p.grad`` (no reset inside); the caller resets every third
    call: a program traced with a gradient present is never replayed on a None one (nor the
    reverse), and the accumulated gradients and weights match the eager twin's."""

    def change(i, ctx):
        if i % 3 == 0:
            ctx.opt.reset_grad()

    g_eager, g_comp, f = _twins(lambda ctx: _loss_step(ctx, reset=False), change, steps=15)
    assert f.stats["replays"] > 0, f.stats
    for i, (a, b) in enumerate(zip(g_eager, g_comp)):
        for ga, gb in zip(a, b):
            np.testing.assert_array_equal(ga, gb, err_msg=f"call {i}")


class _SlottedConfig:
    __slots__ = ("scale", "__private")

    def __init__(self):
        self.scale = 1.0
        self.__private = 0.0

    def offset(self):
        return self.__private

    def set_offset(self, v):
        self.__private = v


def test_attributes_in_slots_are_guarded():
    """A config object with ``__slots__`` (no ``__dict__``), public and name-mangled."""

    def make(ctx):
        cfg = ctx.cfg = _SlottedConfig()
        return _loss_step(ctx, scale=lambda _: cfg.scale + cfg.offset())

    def change(i, ctx):
        if i == 4:
            ctx.cfg.scale = 3.0
        if i == 7:
            ctx.cfg.set_offset(2.0)

    _, _, f = _twins(make, change, steps=11)
    assert f.stats["replays"] > 0 and f.stats["retraces"] >= 2, f.stats


def test_import_needle_leaves_the_speed_wing_unloaded():
    """``import needle`` runs the course's code only; ``ndl.compile`` loads ``needle.fast``."""
    import subprocess
    import sys

    code = (
        "import sys, needle\n"
        "assert 'needle.fast' not in sys.modules, 'needle.fast loaded by import needle'\n"
        "from needle.fast import compile\n"
        "assert needle.compile is compile\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_gives_up_after_max_traces_traced_calls_and_warns():
    """With the default ``max_traces`` (6), a step whose kernels change at every call is
    traced 6 times, then runs eagerly with a warning naming why (it used to be traced at
    every call: only the last traces were counted)."""
    calls = []

    def f(x):
        calls.append(1)
        for _ in range(len(calls)):
            x = x + 1
        return x

    compiled = ndl.compile(f)
    x = ndl.Tensor(np.zeros(3, np.float32), device=ndl.cpu())
    with pytest.warns(CaptureWarning, match="device calls"):
        for n in range(1, 11):
            np.testing.assert_array_equal(compiled(x).numpy(), np.full(3, n, np.float32))
    assert compiled.stats["traces"] == 6 and compiled.stats["eager"] == 4, compiled.stats


def test_forward_replaced_on_the_class_is_guarded(monkeypatch):
    """A module class's ``forward`` replaced after capture (a patched layer)."""
    plain = nn.Linear.forward

    def change(i, ctx):
        if i == 5:
            monkeypatch.setattr(nn.Linear, "forward", lambda self, x: plain(self, x) * 2.0)
        if i == 0:
            monkeypatch.setattr(nn.Linear, "forward", plain)

    _, _, f = _twins(_loss_step, change)
    assert f.stats["replays"] > 0 and f.stats["retraces"] >= 1, f.stats
