"""Grad mode (``no_grad``, ``enable_grad``, ``set_grad_enabled``) and the course's lazy mode:
nesting, restoring after exceptions, decorators and generators, one mode per thread, and the
count of threads out of the defaults that lets ops skip reading their thread's modes."""

from __future__ import annotations

import pytest

import needle as ndl
from needle import autograd

pytestmark = [pytest.mark.autograd, pytest.mark.both_backends]


def test_grad_mode_context_managers_nest_and_restore():
    x = ndl.Tensor([1.0, 2.0])
    assert ndl.is_grad_enabled()
    with ndl.no_grad():
        assert not ndl.is_grad_enabled() and not (x * 2).requires_grad
        with ndl.enable_grad():
            assert (x * 2).requires_grad
        assert not ndl.is_grad_enabled()
    assert ndl.is_grad_enabled()
    with pytest.raises(ZeroDivisionError):
        with ndl.no_grad():
            raise ZeroDivisionError
    assert ndl.is_grad_enabled()

    @ndl.no_grad()
    def double(t):
        return t * 2

    assert not double(x).requires_grad and (x * 2).requires_grad


def test_grad_mode_is_per_thread():
    """One thread inside no_grad() (or a fast backward pass) does not stop another thread's ops
    from recording their graph."""
    import threading

    inside, release = threading.Event(), threading.Event()
    seen = {}

    def holder():
        with ndl.no_grad():
            inside.set()
            release.wait(10)
            seen["holder"] = (ndl.Tensor([1.0]) * 2).requires_grad

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert inside.wait(10)
        x = ndl.Tensor([3.0])
        y = x * x
        assert y.requires_grad
        y.backward()
        assert x.grad.numpy()[0] == 6
    finally:
        release.set()
        thread.join(10)
    assert seen["holder"] is False


def test_ops_read_the_thread_modes_whenever_a_thread_left_the_defaults(monkeypatch):
    """Ops skip reading this thread's grad and lazy modes only while every thread is in the
    defaults (grad_mode.MODES_CHANGED holds the others): the set follows entering and leaving
    no_grad, lazy mode and exceptions, and setting a mode to what it was changes nothing."""
    import threading

    from needle import grad_mode

    changed = grad_mode.MODES_CHANGED
    assert len(changed) == 0
    x = ndl.Tensor([1.0], requires_grad=True)
    with ndl.no_grad():
        assert len(changed) == 1 and not (x * 2).requires_grad
        with ndl.no_grad():
            assert len(changed) == 1
        with ndl.enable_grad():
            assert len(changed) == 0 and (x * 2).requires_grad
    assert len(changed) == 0
    with pytest.raises(KeyError):
        with ndl.no_grad():
            raise KeyError
    assert len(changed) == 0
    grad_mode._grad_mode.enabled = True  # already so: no change to count
    assert len(changed) == 0
    monkeypatch.setattr(autograd, "LAZY_MODE", True)
    assert len(changed) == 1 and (x * 2).cached_data is None
    with ndl.no_grad():  # lazy and not recording: still one thread
        assert len(changed) == 1
        lazy = x * 2
        assert lazy.cached_data is None and not lazy.requires_grad
    monkeypatch.undo()
    assert len(changed) == 0 and lazy.numpy()[0] == 2

    # another thread inside no_grad: this thread reads its own (default) modes and records
    inside, release = threading.Event(), threading.Event()

    def holder():
        with ndl.no_grad():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert inside.wait(10) and len(changed) == 1
        y = x * 3
        assert y.requires_grad and y.cached_data is not None
    finally:
        release.set()
        thread.join(10)
    assert len(changed) == 0


def test_lazy_mode_is_per_thread(monkeypatch):
    """autograd.LAZY_MODE = True (the course's switch) defers this thread's ops only: another
    thread's ops still compute at once."""
    import threading

    monkeypatch.setattr(autograd, "LAZY_MODE", True)
    assert autograd.LAZY_MODE is True
    deferred = ndl.Tensor([1.0]) * 2
    assert deferred.cached_data is None
    seen = {}

    def other():
        seen["lazy"] = autograd.LAZY_MODE
        seen["computed"] = (ndl.Tensor([1.0]) * 2).cached_data is not None

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert seen == {"lazy": False, "computed": True}
    assert deferred.numpy()[0] == 2


def test_set_grad_enabled_as_a_statement_sets_the_mode():
    """``ndl.set_grad_enabled(False)`` on its own line turns recording off, as PyTorch's does
    (it used to be a context manager that was never entered: a silent no-op)."""
    import threading

    x = ndl.Tensor([1.0, 2.0], requires_grad=True)
    seen = {}

    def other():  # a thread of its own: the statement leaves no other thread's mode changed
        ndl.set_grad_enabled(False)
        seen["off"] = (ndl.is_grad_enabled(), (x * 2).requires_grad)
        ndl.set_grad_enabled(True)
        seen["on"] = (ndl.is_grad_enabled(), (x * 2).requires_grad)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert seen == {"off": (False, False), "on": (True, True)}
    assert ndl.is_grad_enabled()
    # the other forms still restore the mode they found
    with ndl.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert ndl.is_grad_enabled()

    @ndl.set_grad_enabled(False)
    def double(t):
        return t * 2

    assert ndl.is_grad_enabled()  # decorating changes nothing until a call
    assert not double(x).requires_grad and ndl.is_grad_enabled()


def test_no_grad_on_a_generator_function_covers_its_body():
    """``@no_grad()`` on a generator function used to cover only the creation of the
    generator: its body recorded the graph. Each step now runs without recording, and the
    consumer keeps its own mode between steps (PyTorch's semantics)."""
    x = ndl.Tensor([1.0, 2.0], requires_grad=True)

    @ndl.no_grad()
    def batches(t):
        for _ in range(2):
            received = yield t * 2
            assert received is None or not (t * received).requires_grad

    outputs, consumer_modes = [], []
    for b in batches(x):
        outputs.append(b.requires_grad)
        consumer_modes.append((ndl.is_grad_enabled(), (x * 3).requires_grad))
    assert outputs == [False, False]
    assert consumer_modes == [(True, True), (True, True)]
    # send, throw and close also run in the decorated mode, and the return value comes back
    gen = batches(x)
    assert not next(gen).requires_grad
    assert not gen.send(3.0).requires_grad
    with pytest.raises(StopIteration):
        gen.send(3.0)
    assert ndl.is_grad_enabled()

    @ndl.enable_grad()
    def recorded(t):
        yield t * 2
        return "done"

    with ndl.no_grad():
        gen = recorded(x)
        assert next(gen).requires_grad
        assert not (x * 2).requires_grad
        with pytest.raises(StopIteration) as stop:
            next(gen)
    assert stop.value.value == "done"


@pytest.mark.parametrize("create_graph", [True, False])
def test_backward_restores_the_mode_it_found_whatever_a_gradient_did(create_graph):
    """A gradient that turns recording off and leaves it off (a student's debugging line) does
    not outlive its backward pass: the pass restores the mode it was called in, whether or not
    it had to switch it."""

    class Leaky(ndl.ops.EWiseMul):
        def gradient(self, out_grad, node):
            ndl.set_grad_enabled(False)
            return super().gradient(out_grad, node)

    x = ndl.Tensor([1.0, 2.0], requires_grad=True)
    Leaky()(x, x).sum().backward(create_graph=create_graph)
    assert ndl.is_grad_enabled()
    assert x.grad.numpy().tolist() == [2.0, 4.0]


def test_threads_switching_modes_at_once_leave_no_thread_marked():
    """Four threads entering and leaving no_grad and lazy mode thousands of times at once: each
    thread's ops follow its own modes throughout, and afterwards no thread is left marked (an
    op of this thread records again without reading per-thread modes)."""
    import threading

    from needle import grad_mode

    x = ndl.Tensor([1.0], requires_grad=True)
    wrong = []

    def worker():
        for i in range(2000):
            with ndl.no_grad():
                if (x * 2).requires_grad:
                    wrong.append("recorded inside no_grad")
            if i % 100 == 0:
                grad_mode._grad_mode.lazy = True
                grad_mode._grad_mode.lazy = False
            if not (x * 2).requires_grad:
                wrong.append("did not record outside no_grad")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not wrong and not grad_mode.MODES_CHANGED
    assert (x * 2).requires_grad
