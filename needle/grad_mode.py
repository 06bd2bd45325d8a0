"""Grad mode: whether ops record the graph, held per thread (PyTorch's ``no_grad``,
``enable_grad``, ``set_grad_enabled`` and ``is_grad_enabled``; re-exported by
``needle.autograd`` and ``needle``)."""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, List, Set, TypeVar, cast


class _GradMode(threading.local):
    """Whether ops record the graph (``enabled``) and whether they defer their computation
    (``lazy``, the course's ``LAZY_MODE``), per thread (class defaults, so every new thread
    starts recording and eager): one thread's ``no_grad()`` or fast backward pass never stops
    another thread's ops from recording theirs.

    ``MODES_CHANGED`` holds the threads (their idents) whose modes are not the defaults, so
    that an op can skip reading this thread's two modes (a per-thread lookup each) while it is
    empty. A set, not a count under a lock: adding and discarding one thread's own ident are
    single, atomic set operations, and whether an op reads the modes only matters for its own
    thread, whose ident is in the set whenever its modes are not the defaults."""

    _enabled = True
    _lazy = False

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._set(bool(value), self._lazy)

    @property
    def lazy(self) -> bool:
        return self._lazy

    @lazy.setter
    def lazy(self, value: bool) -> None:
        self._set(self._enabled, bool(value))

    def _set(self, enabled: bool, lazy: bool) -> None:
        self._enabled = enabled
        self._lazy = lazy
        if enabled and not lazy:
            MODES_CHANGED.discard(threading.get_ident())
        else:
            MODES_CHANGED.add(threading.get_ident())


# The threads whose grad mode or lazy mode is not the default (see _GradMode).
MODES_CHANGED: Set[int] = set()
_grad_mode = _GradMode()


def is_grad_enabled() -> bool:
    """True when ops called in this thread record the graph (the default)."""
    return _grad_mode.enabled


_F = TypeVar("_F", bound=Callable[..., Any])  # a function a grad-mode class decorates


class _GradModeSetter:
    """Sets this thread's recording mode to ``self.mode`` on ``__enter__`` and restores the
    previous one on ``__exit__`` (also after an exception), as PyTorch's grad-mode classes do.
    As a decorator it covers every call of the function, and of a generator function the
    whole body: each step of the generator runs in the mode, its consumer in its own."""

    mode = True

    def __init__(self) -> None:
        self._previous: List[bool] = []  # a stack: one instance may be entered again, nested

    def __enter__(self) -> None:
        self._previous.append(_grad_mode.enabled)
        _grad_mode.enabled = self.mode

    def __exit__(self, *exc: object) -> None:
        _grad_mode.enabled = self._previous.pop()

    def _fresh(self) -> "_GradModeSetter":
        fresh = _GradModeSetter()
        fresh.mode = self.mode
        return fresh

    def __call__(self, fn: _F) -> _F:
        if inspect.isgeneratorfunction(fn):
            return cast(_F, _wrap_generator(self._fresh, fn))

        @functools.wraps(fn)
        def in_mode(*args: Any, **kwargs: Any) -> Any:
            with self._fresh():
                return fn(*args, **kwargs)

        return cast(_F, in_mode)


def _wrap_generator(mode: Callable[[], _GradModeSetter], fn: Callable[..., Any]) -> Any:
    """``fn`` (a generator function) whose every step (start, ``send``, ``throw``, ``close``)
    runs inside ``mode()``; between steps the consumer's mode applies (PyTorch's design)."""

    @functools.wraps(fn)
    def generator(*args: Any, **kwargs: Any) -> Any:
        gen = fn(*args, **kwargs)
        try:
            with mode():
                response = gen.send(None)
            while True:
                try:
                    request = yield response
                except GeneratorExit:
                    with mode():
                        gen.close()
                    raise
                except BaseException as error:
                    with mode():
                        response = gen.throw(error)
                else:
                    with mode():
                        response = gen.send(request)
        except StopIteration as stop:
            return stop.value

    return generator


class set_grad_enabled(_GradModeSetter):  # noqa: N801 (PyTorch's name)
    """Ops in this thread record the graph iff ``mode``: from the call on as a statement
    (``set_grad_enabled(False)``), inside the block as ``with set_grad_enabled(mode):`` (the
    previous mode restored on exit, also after an exception), or in every call of a function
    it decorates. As PyTorch's."""

    def __init__(self, mode: bool) -> None:
        super().__init__()
        self.mode = bool(mode)
        self._previous.append(_grad_mode.enabled)  # set now: a plain call is a statement
        _grad_mode.enabled = self.mode

    def __enter__(self) -> None:
        return None  # the mode was set by __init__

    def __call__(self, fn: _F) -> _F:
        _grad_mode.enabled = self._previous.pop()  # a decorator: only its calls change the mode
        return super().__call__(fn)


class no_grad(_GradModeSetter):  # noqa: N801 (PyTorch's name)
    """``with no_grad():`` (or ``@no_grad()``) ops in this thread record no graph: every result
    is a constant with ``requires_grad=False`` and keeps no reference to its inputs
    (evaluation, in-place updates). An extension (PyTorch's ``torch.no_grad``); the course's
    needle has no grad mode."""

    mode = False


class enable_grad(_GradModeSetter):  # noqa: N801 (PyTorch's name)
    """``with enable_grad():`` (or ``@enable_grad()``) ops in this thread record the graph, even
    inside ``no_grad()``."""

    mode = True
