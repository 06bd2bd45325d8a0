"""Devices of the ``nd`` backend: a name plus the module implementing the device protocol.

``cpu()`` is the compiled C++ module, ``cuda()`` the compiled CUDA module (``enabled()`` is
False where it was not built or no GPU is visible), ``cpu_numpy()`` the numpy reference module.
Each is one object, so ``enabled()`` is asked once and comparisons stay cheap.

Two defaults (docs/array_layer.md, "Default devices"):

* :func:`default_device` is the course's: ``cpu_numpy()``, used by ``NDArray(x)`` and the
  module functions (``array``, ``empty``, ``full``) when no device is given.
* :func:`default_tensor_device` is needle's: the compiled ``cpu()`` when it is built, else
  ``cpu_numpy()``; ``Tensor`` and ``init`` use it so that everything lands on one device.

One public hook lets a tool watch the device calls of a thread: :func:`recording` (used by
``needle.fast.compile`` to capture a training step's kernels). With no recording active in any
thread, a device's attributes are the module's functions themselves (no cost).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from types import BuiltinFunctionType, ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Protocol

import numpy as np
from numpy.typing import DTypeLike

from . import ndarray_backend_numpy, protocol

if TYPE_CHECKING:
    from .ndarray import NDArray

_REBUILD = "rebuild it with `make build` (or `pip install -e .`)"

try:
    from . import ndarray_backend_cpu as ndarray_backend_cpu

    _CPU_IMPORT_ERROR = None
except ImportError as exc:  # not compiled, or compiled for another Python / machine
    ndarray_backend_cpu = None
    _CPU_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


def _warn_if_build_lost_its_module() -> None:
    """One stderr line when this checkout has a build (``build/`` beside ``needle/``) but the
    compiled CPU module is missing or broken: everything would otherwise run on the numpy
    device without a word (e.g. after a rebuild that was interrupted)."""
    import sys
    from pathlib import Path

    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "CMakeLists.txt").is_file() and (checkout / "build").is_dir():
        print(
            f"needle: the compiled CPU module is missing or broken ({_CPU_IMPORT_ERROR}); "
            f"cpu() is disabled and Tensors go to cpu_numpy(): {_REBUILD}",
            file=sys.stderr,
        )


if ndarray_backend_cpu is None:
    _warn_if_build_lost_its_module()

try:
    from . import ndarray_backend_cuda as ndarray_backend_cuda

    _CUDA_IMPORT_ERROR = None
except ImportError as exc:  # built without nvcc
    ndarray_backend_cuda = None
    _CUDA_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


class BackendDevice:
    """A device: a name plus the module implementing the device protocol (``protocol.py``).

    Devices compare equal by name; attribute access forwards to the module (and is cached on
    the device), so ``device.ewise_binary`` is the module's kernel.
    """

    def __init__(self, name: str, mod: Optional[ModuleType], import_error: str | None = None):
        self.name = name
        self.mod = mod
        self._import_error = import_error

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, BackendDevice) and self.name == other.name)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name + "()"

    def __getattr__(self, name: str) -> Any:
        if name in ("mod", "_import_error", "_enabled"):  # before __init__ (copy, pickle)
            raise AttributeError(name)
        mod = self.__dict__.get("mod")
        if mod is None:
            raise RuntimeError(self._why_disabled())
        try:
            value = getattr(mod, name)
        except AttributeError:
            hint = (
                f" (a compiled module older than the protocol: {_REBUILD})"
                if hasattr(protocol.DeviceModule, name)
                else ""
            )
            raise AttributeError(f"device {self.name}() has no {name!r}{hint}") from None
        with _RECORDING_LOCK:
            if _recorded_threads and name in _recorded_names(mod):
                value = _recorded(self, name, value)
            self.__dict__[name] = value  # later look-ups skip __getattr__
        return value

    def _why_disabled(self) -> str:
        if self.mod is None:
            reason = (
                f"its compiled module failed to import ({self._import_error})"
                if self._import_error
                else "its module is not built"
            )
            return f"device {self.name}() is not enabled: {reason}; {_REBUILD}"
        return f"device {self.name}() is not enabled: no GPU is visible on this machine"

    def enabled(self) -> bool:
        """True when the module is built and, for CUDA, a GPU is visible (asked once)."""
        enabled = self.__dict__.get("_enabled")
        if enabled is None:
            is_available = getattr(self.mod, "is_available", None)
            enabled = self.mod is not None and (is_available is None or bool(is_available()))
            self._enabled = enabled
        return enabled

    def _check(self) -> None:
        if not self.enabled():
            raise RuntimeError(self._why_disabled())

    def cache_info(self) -> dict[str, Any] | None:
        """The module's buffer-cache report (cap, bytes held, hits...) or None if it keeps none."""
        info = getattr(self.mod, "cache_info", None)
        if info is None:
            return None
        report: dict[str, Any] = info()
        return report

    def cache_clear(self) -> None:
        """Release every buffer the module's cache holds (no-op for a module without one)."""
        clear = getattr(self.mod, "cache_clear", None)
        if clear is not None:
            clear()

    def randn(self, *shape: int, dtype: str = "float32") -> "NDArray":
        """Standard normal samples from numpy's global RNG, moved to this device."""
        return self._draw("randn", np.random.randn, shape, dtype)

    def rand(self, *shape: int, dtype: str = "float32") -> "NDArray":
        """Uniform [0, 1) samples from numpy's global RNG, moved to this device."""
        return self._draw("rand", np.random.rand, shape, dtype)

    def _draw(
        self, kind: str, draw: Callable[..., Any], shape: tuple[int, ...], dtype: str
    ) -> "NDArray":
        from .ndarray import NDArray

        stack = getattr(_thread, "stack", None)
        if not stack:
            return NDArray(draw(*shape).astype(dtype), device=self)
        _thread.stack = ()  # the copy to the device is part of the draw, not reported
        try:
            result = NDArray(draw(*shape).astype(dtype), device=self)
        finally:
            _thread.stack = stack
        stack[-1].record(self, kind, tuple(int(n) for n in shape), result)
        return result

    def one_hot(self, n: int, i: Any, dtype: str = "float32") -> "NDArray":
        """Rows of the n×n identity selected by the integer indices ``i``: shape i.shape + (n,)."""
        from .ndarray import NDArray

        return NDArray(np.eye(n, dtype=dtype)[np.asarray(i, dtype=np.int64)], device=self)

    def empty(self, shape: Iterable[int], dtype: str = "float32") -> "NDArray":
        """An uninitialised float32 array of ``shape`` on this device."""
        if type(dtype) is not str or dtype != "float32":  # "float32" needs no numpy look-up
            _check_dtype(dtype)
        return ndarray.NDArray.make(shape, device=self)

    def full(self, shape: Iterable[int], fill_value: float, dtype: str = "float32") -> "NDArray":
        """A float32 array of ``shape`` filled with ``fill_value`` on this device."""
        if type(dtype) is not str or dtype != "float32":
            _check_dtype(dtype)
        arr = ndarray.NDArray.make(shape, device=self)
        arr.fill(fill_value)
        return arr


# One object per device: enabled() is asked once, and `device == cpu()` stays cheap.
_CUDA = BackendDevice("cuda", ndarray_backend_cuda, _CUDA_IMPORT_ERROR)
_CPU_NUMPY = BackendDevice("cpu_numpy", ndarray_backend_numpy)
_CPU = BackendDevice("cpu", ndarray_backend_cpu, _CPU_IMPORT_ERROR)


def cuda() -> BackendDevice:
    """The CUDA device (``enabled()`` is False without the module or a GPU)."""
    return _CUDA


def cpu_numpy() -> BackendDevice:
    """The numpy reference device."""
    return _CPU_NUMPY


def cpu() -> BackendDevice:
    """The compiled C++ CPU device."""
    return _CPU


def default_device() -> BackendDevice:
    """The device ``NDArray(...)`` uses when given none: ``cpu_numpy()`` (the course's choice)."""
    return _CPU_NUMPY


def default_tensor_device() -> BackendDevice:
    """The device needle's ``Tensor`` and ``init`` use when none is given: the compiled
    ``cpu()`` when it is built and enabled, else ``cpu_numpy()``."""
    return _CPU if _CPU.enabled() else _CPU_NUMPY


def all_devices() -> list[BackendDevice]:
    """Every device needle knows, enabled or not: ``[cpu(), cuda(), cpu_numpy()]``."""
    return [cpu(), cuda(), cpu_numpy()]


def _check_dtype(dtype: DTypeLike) -> None:
    if dtype is not None and np.dtype(dtype) != np.float32:
        raise TypeError(f"NDArray supports only float32, got dtype {dtype!r}")


# ---- recording: the public hook for tools that capture device calls ---------------------------
class Recorder(Protocol):
    """What :func:`recording` reports to: one call per device call, after it returned."""

    def record(self, device: BackendDevice, name: str, args: tuple[Any, ...], result: Any) -> None:
        """``name`` is a module function (``Array``, ``to_numpy``, a kernel) called with
        ``args``, or ``"rand"``/``"randn"`` with the shape as ``args`` and the NDArray drawn
        as ``result``."""


_thread = threading.local()  # .stack: this thread's active recorders, innermost last
_RECORDING_LOCK = threading.Lock()
_recorded_threads = 0  # recording() blocks active in all threads together
# Module functions that are bookkeeping, not computation: never reported.
_NOT_RECORDED = frozenset(
    {"memory_stats", "reset_peak", "cache_info", "cache_clear", "is_available"}
)


@contextmanager
def recording(recorder: Recorder) -> Iterator[None]:
    """Report every device call this thread makes inside the block to ``recorder.record``.

    Covered: each function of a device's module (allocation ``Array``, ``to_numpy``, every
    kernel) and the ``rand``/``randn`` draws; calls made while one is being reported are not
    reported. Other threads are never reported, blocks nest (the innermost recorder gets the
    calls), and leaving the block (normally or by an exception) stops the reports. While any
    thread records, each device call of every thread costs one thread-local look-up; with no
    recording active, devices call their modules directly.
    """
    global _recorded_threads
    stack = getattr(_thread, "stack", None)
    if not isinstance(stack, list):
        if stack == ():  # inside a reported call
            raise RuntimeError("recording() cannot start inside a device call being recorded")
        stack = _thread.stack = []
    with _RECORDING_LOCK:
        _recorded_threads += 1
        if _recorded_threads == 1:
            _set_dispatch(recorded=True)
    stack.append(recorder)
    try:
        yield
    finally:
        stack.remove(recorder)
        with _RECORDING_LOCK:
            _recorded_threads -= 1
            if _recorded_threads == 0:
                _set_dispatch(recorded=False)


def is_recording() -> bool:
    """True while this thread is inside a :func:`recording` block."""
    return bool(getattr(_thread, "stack", None))


def _recorded_names(mod: ModuleType) -> frozenset[str]:
    """The module functions a recording reports: the protocol's, the course's compact entry
    points (Python functions in the numpy module) and the module's builtins."""
    names = {n for n in vars(protocol.DeviceModule) if not n.startswith("_")}
    names |= set(protocol.COURSE_PARAMS)
    names |= {
        n
        for n in dir(mod)
        if not n.startswith("_") and isinstance(getattr(mod, n), BuiltinFunctionType)
    }
    return frozenset(n for n in names - _NOT_RECORDED if callable(getattr(mod, n, None)))


def _set_dispatch(recorded: bool) -> None:
    """Point each device's cached functions at reporting wrappers, or back at the module's
    functions (called under the lock, when the first recording starts or the last ends)."""
    for dev in all_devices():
        if dev.mod is None:
            continue
        for name in _recorded_names(dev.mod):
            fn = getattr(dev.mod, name)
            dev.__dict__[name] = _recorded(dev, name, fn) if recorded else fn


def _recorded(device: BackendDevice, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        stack = getattr(_thread, "stack", None)
        if not stack:
            return fn(*args, **kwargs)
        if kwargs:  # reported as the positional arguments they stand for
            args, kwargs = _positional(name, args, kwargs), {}
        _thread.stack = ()  # calls made by this call are not reported
        try:
            result = fn(*args)
        finally:
            _thread.stack = stack
        stack[-1].record(device, name, args, result)
        return result

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def _positional(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The arguments of a call of the protocol function ``name``, all positional, in order."""
    import inspect

    spec = getattr(protocol.DeviceModule, name, None)
    if spec is None:
        raise TypeError(f"device function {name!r} called with keywords cannot be recorded")
    bound = inspect.signature(spec).bind(None, *args, **kwargs)
    return tuple(bound.arguments.values())[1:]


# Last: ndarray imports this module, and empty()/full() build its arrays (a module global, not
# an import statement run on every call).
from . import ndarray  # noqa: E402
