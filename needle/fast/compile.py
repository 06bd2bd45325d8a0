"""``compile``: a training step captured once and replayed as a flat list of kernel calls.

Lecture 7 contrasts define-and-run (the graph is rebuilt by Python at every step) with
define-then-run (the graph is built once and executed many times); lectures 23-24 compile such
a graph into a list of kernels over preallocated memory. ``step = needle.fast.compile(fn)``
(also ``ndl.compile``) does this for a needle step function (forward, backward and optimizer
update): it **traces** calls of ``fn`` eagerly while recording every call into the device
modules (``ewise_binary``, ``matmul_strided``, ``adam_update``...: the kernels of
``protocol.py``) through the device layer's public hook ``device.recording``, and once two
consecutive calls issued the same kernels it **replays** that list on new inputs of the same
shapes, with no Tensor, no graph and no Python op code run.

What a recorded buffer becomes in the replay (its *slot*):

* an **input**: the array of a Tensor passed to the step (rebound at every call);
* **external**: a buffer that existed before the call (parameters, optimizer state): the same
  buffer, updated in place by the replay exactly as the eager kernels update it;
* **carried**: state that the step rebinds in Python (an optimizer gives each parameter a new
  array every step, the course's ``p.data = ...``; batch norm's running averages are a new
  Tensor each step): the replay reads the array that the owner (the module attribute, the
  ``grad``) holds at the time of the call and computes the new value into a new array, which
  it gives the owner as the eager step does (the parameter's Tensor gets the new array, the
  running average a new Tensor), so a snapshot ``Tensor(p)`` keeps the old values. Two traced
  calls show it: the owner held what each call read before it, and what it made after it;
  state no owner holds needs a third traced call and is copied into its old buffer;
* **kept**: a temporary that Python still holds after the call (``p.grad``, a saved
  activation): the replay writes into that same buffer, so Python sees the new values (a
  Tensor kept from an earlier call changes with it); each replay binds ``p.grad`` again to the
  Tensor the traced call left there, so gradients reset outside the step come back;
* **pooled**: every other temporary. Pooled slots share a few preallocated buffers: a buffer
  whose slot is dead is handed to the next slot of the same size (lecture 12's memory reuse);
  :meth:`CompiledStep.memory_plan` reports the counts.

The outputs (Tensors returned by ``fn``) come back as fresh, detached Tensors at every call.

Guards: a program is replayed only when the call provably matches it; otherwise the step
re-traces (or, when it cannot be captured, runs eagerly with the reason in ``stats``):

* a new **signature** of the inputs (shape, strides, dtype, device of each Tensor, the value of
  every non-Tensor argument, grad mode) selects another captured program or traces a new one;
* the **Python state the step reads**: every object that ``fn`` names (closure variables, the
  globals its code names, a bound method's object, objects passed in ``watch=``) and, through
  them, every object reachable by attributes (``__dict__`` or ``__slots__``), lists, tuples and
  dicts (modules, optimizers, plain config or scheduler objects): their numbers, flags and
  strings, the contents of numpy arrays, the identity and ``requires_grad`` of Tensors
  (``p.requires_grad = False`` freezes a layer: re-trace), the set of attribute names (a
  ``forward`` assigned on an instance), the class and, for modules, the class's ``forward``;
* **state the step changes**: a number, flag, numpy array or container the step itself changes
  cannot be repeated by a replay (which runs no Python), so such a step is refused: it runs
  eagerly, and a :class:`CaptureWarning` and ``stats["reasons"]`` name the value (so a branch
  on a step counter kept by the step is never frozen). The one exception is an optimizer's
  step count ``t``, which the replay advances and passes to the kernels that take it (Adam's
  bias correction);
* **device values read by Python** (``x.numpy()`` inside the step, e.g. batch norm's test
  whether a statistic's adjoint is zero) are read again during the replay and compared with the
  traced value; a difference abandons the replay (before any buffer that outlives the call was
  written, and giving back the random numbers it drew) and re-traces. A step that reads a
  value after updating its state (a parameter's new array included) is never captured;
* random numbers (``init.rand``/``randn``, dropout masks) are recorded as a draw: the replay
  draws fresh numbers from numpy's global RNG in the same order as the eager step would.

Threads: calls of one compiled step run one at a time (a lock); recording is per thread, so a
step traced in one thread never records (or keeps buffers of) another thread's calls, and a
trace that ends, normally or by an exception, stops recording.

Not guarded (stated honestly; pass such state in ``watch=`` or call :meth:`CompiledStep.reset`
after changing it):

* state reached only through objects the step does not name: another module's globals, class
  attributes (other than a module's ``forward``), state held inside C extension objects (not in
  a ``__dict__`` or Python ``__slots__``), values computed by properties from such state, and
  anything deeper than 8 references from ``fn``;
* the outside world: files, clocks, environment variables, a random generator other than
  numpy's global one;
* host data (numpy arrays) the step builds itself is captured as a constant when two traced
  calls gave the same bytes.

Cost and limits: a step whose kernels keep changing after ``max_traces`` traced calls runs
eagerly from then on (``stats`` says why). A device value read in Python is compared exactly,
so a step that reads a value that changes every call (a loss printed inside the step) re-traces
every call and ends up eager. The guard compares the guarded numpy arrays' contents at every
replay (a step that names a large dataset pays for reading it). Outputs are detached (no
graph). Tracing holds every buffer of the traced call until it ends (more memory than eager,
three times). Only the ``nd`` backend is captured (``NEEDLE_BACKEND=np`` runs ``fn`` eagerly).
"""

from __future__ import annotations

import gc
import sys
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import backend_selection
from ..autograd import Tensor
from . import guards
from .guards import SCALARS, CaptureError
from .program import Program, bake, build, owned_entries
from .recording import Trace, TraceRecorder

__all__ = ["compile", "CompiledStep", "CaptureWarning"]


class CaptureWarning(UserWarning):
    """A compiled step refused to capture (it runs eagerly from then on); the message names
    the cause."""


class _Replay(Exception):
    """Internal: a replay was abandoned (a guard failed) before writing persistent state."""


class CompiledStep:
    """A step function captured by :func:`compile`; call it like the function.

    ``stats`` counts ``traces`` (eager calls that were recorded), ``replays``, ``eager`` calls
    (not captured), ``retraces`` (a program dropped by a guard) and keeps the ``reasons``; a
    :class:`CaptureWarning` names the cause when the step stops capturing an input signature.
    Calls from several threads run one at a time.
    """

    def __init__(
        self, fn: Callable, watch: Sequence[Any] = (), max_traces: int = 6, cache: int = 8
    ) -> None:
        if not callable(fn):
            raise TypeError(f"ndl.compile needs a function, got {type(fn).__name__}")
        if max_traces < 2:
            raise ValueError(f"ndl.compile: max_traces must be at least 2, got {max_traces}")
        self.fn = fn
        self.watch = tuple(watch)
        self.max_traces = max_traces
        self.cache = cache
        self.stats: Dict[str, Any] = {
            "traces": 0,
            "replays": 0,
            "eager": 0,
            "retraces": 0,
            "reasons": [],
        }
        self._programs: Dict[tuple, Program] = {}
        self._pending: Dict[tuple, List[Trace]] = {}
        self._given_up: Dict[tuple, str] = {}
        self._short: Dict[tuple, int] = {}  # programs in a row dropped after < 2 replays
        self._traced: Dict[tuple, int] = {}  # traced calls since the last program was built
        self._lock = threading.RLock()  # one call at a time: a replay owns the program's pool
        self.__doc__ = getattr(fn, "__doc__", None)

    def reset(self) -> None:
        """Forget every captured program (the next calls trace again)."""
        with self._lock:
            self._programs.clear()
            self._pending.clear()
            self._given_up.clear()
            self._short.clear()
            self._traced.clear()

    @property
    def program(self) -> Optional[Program]:
        """The most recently captured program (None before one is captured)."""
        return next(reversed(self._programs.values()), None) if self._programs else None

    def kernels(self) -> List[str]:
        """The captured kernel list of :attr:`program`, one line per device call."""
        return self.program.lines() if self.program else []

    def memory_plan(self) -> Dict[str, int]:
        """Counts and bytes of :attr:`program`'s buffers: ``temporaries`` (pooled slots), the
        ``pool_buffers`` they share and their ``pool_bytes``, ``temporary_bytes`` (what the
        pooled slots would take without sharing), the ``kept`` temporaries (held by Python
        after the step, such as ``p.grad``) and their ``kept_bytes``, and the ``kernels``."""
        p = self.program
        if p is None:
            return {}
        pooled = [s for s, d in enumerate(p.slots) if d[0] == "pool"]
        sizes: Dict[int, int] = {}
        for s in pooled:
            sizes[p.pool_of[s]] = p.slots[s][1]
        return {
            "temporaries": len(pooled),
            "temporary_bytes": 4 * sum(p.slots[s][1] for s in pooled),
            "pool_buffers": len(sizes),
            "pool_bytes": 4 * sum(sizes.values()),
            "kept": sum(1 for d in p.slots if d[0] == "kept"),
            "kept_bytes": 4 * sum(d[1].size for d in p.slots if d[0] == "kept"),
            "kernels": sum(1 for op in p.ops if op[0] != "read"),
        }

    # -- calling -------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if backend_selection.BACKEND != "nd":
            return self._eager(args, kwargs, None)
        from ..backend_ndarray.device import is_recording

        if is_recording():  # called inside a trace (or another recording): run as written
            return self._eager(args, kwargs, None)
        with self._lock:
            return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict) -> Any:
        try:
            sig, handles = guards.signature(args, kwargs)
        except CaptureError as exc:
            return self._eager(args, kwargs, str(exc))
        if sig in self._given_up:
            return self._eager(args, kwargs, None)
        program = self._programs.get(sig)
        if program is not None:
            reason = guards.check(program.guard, program.grads)
            if reason is None:
                try:
                    result = _replay(program, handles)
                    self.stats["replays"] += 1
                    program.replays += 1
                    return result
                except _Replay as exc:
                    reason = str(exc)
            del self._programs[sig]
            self.stats["retraces"] += 1
            self._note(f"re-trace: {reason}")
            # programs that keep failing their guard at once: the step changes what it reads
            # at (almost) every call, so tracing costs more than it saves
            short = self._short.get(sig, 0) + 1 if program.replays < 2 else 0
            self._short[sig] = short
            if short >= self.max_traces:
                why = f"{short} programs in a row failed their guard: {reason}"
                self._give_up(sig, why)
                return self._eager(args, kwargs, why)
        return self._trace(sig, args, kwargs, handles)

    def _give_up(self, sig: tuple, reason: str) -> None:
        """Run calls of this signature eagerly from now on, saying why once (a warning)."""
        self._given_up[sig] = reason
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        warnings.warn(f"compile: {name} runs eagerly (not captured): {reason}", CaptureWarning, 2)

    def _note(self, reason: str) -> None:
        reasons = self.stats["reasons"]
        if reason not in reasons:
            reasons.append(reason)
            del reasons[:-20]

    def _eager(self, args: tuple, kwargs: dict, reason: Optional[str]) -> Any:
        if reason:
            self._note(reason)
        self.stats["eager"] += 1
        return self.fn(*args, **kwargs)

    def _trace(self, sig: tuple, args: tuple, kwargs: dict, handles: List[Any]) -> Any:
        from ..backend_ndarray.device import recording

        entries = guards.state_objects(self.fn, self.watch)
        trace = Trace(inputs={id(h): j for j, h in enumerate(handles)})
        trace.before = guards.snapshot(entries)
        with recording(TraceRecorder(trace)):
            result = self.fn(*args, **kwargs)
            try:  # inside the recording: realizing a lazy output runs kernels
                trace.outputs, arrays = _describe_outputs(result, trace)
            except CaptureError as exc:
                self._give_up(sig, str(exc))
                self._note(str(exc))
                self.stats["eager"] += 1
                return result  # this call ran eagerly; the next ones will too
        self.stats["traces"] += 1
        trace.after = guards.snapshot(entries)
        del result
        gc.collect()
        trace.kept = _kept(trace.tmp, arrays)
        self._add_trace(sig, trace)
        return _rebuild(trace.outputs, lambda key: arrays[key].buffer[0])

    def _add_trace(self, sig: tuple, trace: Trace) -> None:
        """Keep a traced call; once two agree, build their program."""
        pending = self._pending.setdefault(sig, [])
        pending.append(trace)
        self._traced[sig] = self._traced.get(sig, 0) + 1
        if len(pending) < 2:
            return
        prev2 = pending[-3] if len(pending) >= 3 else None
        try:
            program = build(prev2, pending[-2], pending[-1])
        except CaptureError as exc:
            self._note(str(exc))
            if self._traced[sig] >= self.max_traces:
                self._give_up(sig, str(exc))
                del self._pending[sig], self._traced[sig]
            else:
                del pending[:-2]
            return
        del self._pending[sig], self._traced[sig]
        if len(self._programs) >= self.cache:
            self._programs.pop(next(iter(self._programs)))
        self._programs[sig] = program


def _replay(p: Program, handles: List[Any]) -> Any:
    """Run a program on the input buffers ``handles``; returns the step's outputs."""
    if p.baked is None:
        bake(p)
    assert p.baked is not None
    ops, bufs, inputs = p.baked
    for s, j in inputs:
        bufs[s] = handles[j]
    owned = _bind_owned_state(p, bufs)
    values = [guards.read(c, k, kind) + 1 for c, k, kind in p.counters]
    # a replay abandoned at a read gives back the random numbers it drew: the eager call that
    # follows must draw what the eager step would have drawn (its dropout masks)
    rng = np.random.get_state() if p.draws_before_read else None
    for kind, fn, args, patch in ops:
        if patch:
            args = list(args)
            for pos, source, n in patch:
                args[pos] = bufs[n] if source == 0 else values[n]
        if kind == 1:  # a device value Python read: it must be what the trace read
            if not np.array_equal(fn(*args[:-1]), args[-1], equal_nan=True):
                if rng is not None:
                    np.random.set_state(rng)
                raise _Replay("a device value the step reads in Python changed")
        else:
            fn(*args)
    for src, dst in p.carries:
        if p.slots[src][0] != "fresh":
            size, dev = p.slots[src][1], p.slots[src][2]
            dev.compact(bufs[src], bufs[dst], (size,), (1,), 0)
    _give_owned_state(owned, bufs)
    for (c, k, kind), v in zip(p.counters, values):
        if kind == "attr":
            setattr(c, k, v)
        else:
            c[k] = v
    for t, _before, grad, rebind in p.grads:
        if rebind:
            t.grad = grad
    result = _rebuild(p.outputs, bufs.__getitem__)
    for *_, src, dst in owned:  # let go of the old and the new arrays of the carried state
        bufs[src] = bufs[dst] = None
    return result


def _bind_owned_state(p: Program, bufs: List[Any]) -> List[tuple]:
    """Put the buffer of each carried state's current Tensor into its slot, and a new array
    into the slot of its new value; returns (entry, Tensor, array, new slot, old slot) of each."""
    from ..backend_ndarray import NDArray

    fresh = {dst: src for src, dst in p.carries}
    owned = []
    for s, (c, k, kind, size, device, renew) in owned_entries(p):
        try:
            value = guards.read(c, k, kind)
        except (AttributeError, KeyError):
            value = None
        data = value.cached_data if isinstance(value, Tensor) else None
        if not (
            isinstance(data, NDArray)
            and data.device == device
            and data.is_compact()
            and data.buffer[0].size == size
        ):
            raise _Replay(f"the state {k!r} is no longer a compact Tensor of {size} elements")
        bufs[s] = data.buffer[0]
        bufs[fresh[s]] = device.Array(size)
        owned.append(((c, k, kind, renew), value, data, fresh[s], s))
    return owned


def _give_owned_state(owned: List[tuple], bufs: List[Any]) -> None:
    """Give each owner of carried state its new array, as the eager step did: a new Tensor
    when the step made one (batch norm's running averages), else the same Tensor with the new
    array (a parameter: a snapshot of it keeps the old array)."""
    from ..backend_ndarray import NDArray

    for (c, k, kind, renew), value, data, src, _dst in owned:
        new = NDArray.make(data.shape, device=data.device, handle=bufs[src])
        new.is_compact()  # known compact, as a new eager array is (its kernels depend on it)
        if renew:
            t = type(value).make_const(new, requires_grad=value.requires_grad)
            if kind == "item":
                c[k] = t
            else:
                setattr(c, k, t)
        else:
            value.replace_array(new)


def _kept(tmp: List[Any], arrays: Dict[Any, Any]) -> set:
    """Indices of the temporaries something besides the trace (and the outputs' arrays, which
    are copied) still references after the call."""
    probe = [object()]
    base = sys.getrefcount(probe[0])
    held: Dict[int, int] = {}
    for a in arrays.values():
        key = id(a.buffer[0])  # no local holding the handle while references are counted
        held[key] = held.get(key, 0) + 1
    kept = set()
    for k in range(len(tmp)):
        if sys.getrefcount(tmp[k]) - held.get(id(tmp[k]), 0) > base:
            kept.add(k)
    return kept


def _describe_outputs(result: Any, trace: Trace) -> Tuple[Any, Dict[Any, Any]]:
    """(structure, arrays) of a step's result: Tensors become ("tensor", buffer key, shape,
    strides, offset) and their arrays are returned by key, to be copied."""
    from ..backend_ndarray import NDArray

    arrays: Dict[Any, Any] = {}

    def walk(r: Any) -> Any:
        if isinstance(r, Tensor):
            data = r.realize_cached_data()
            if not isinstance(data, NDArray):
                raise CaptureError("an output is not an NDArray")
            handle, offset = data.buffer
            key = trace.key(handle)
            arrays[key] = data
            return ("tensor", key, data.shape, data.strides, offset, data.device)
        if isinstance(r, (tuple, list)):
            return (type(r).__name__, tuple(walk(x) for x in r))
        if isinstance(r, SCALARS):
            return ("value", r)
        raise CaptureError(f"the step returned a {type(r).__name__}; return Tensors or numbers")

    return walk(result), arrays


def _rebuild(out: Any, handle: Callable[[Any], Any]) -> Any:
    """The result structure with fresh detached Tensors, each a compact copy of its view;
    ``handle(key)`` is the buffer of a key."""
    from ..backend_ndarray import NDArray

    if out[0] == "tensor":
        _, key, shape, strides, offset, device = out
        view = NDArray.make(
            shape, strides=strides, device=device, handle=handle(key), offset=offset
        )
        return Tensor.make_const(NDArray(view))
    if out[0] in ("tuple", "list"):
        items = [_rebuild(o, handle) for o in out[1]]
        return tuple(items) if out[0] == "tuple" else items
    return out[1]


def compile(
    fn: Callable, *, watch: Sequence[Any] = (), max_traces: int = 6, cache: int = 8
) -> CompiledStep:
    """Capture ``fn`` (a training step: forward, backward, optimizer update) into a replayable
    kernel list (see the module docstring: what is guarded, and what is not).

    ``fn`` takes Tensors (and numbers) and returns Tensors, tuples/lists of them, or numbers;
    the compiled step returns the same structure with detached Tensors. ``watch``: more objects
    whose state the guard checks (modules, optimizers). ``max_traces``: traced calls per input
    signature before giving up (then eager); ``cache``: programs kept (one per signature).
    """
    return CompiledStep(fn, watch=watch, max_traces=max_traces, cache=cache)
