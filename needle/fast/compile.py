"""``ndl.compile``: a training step captured once and replayed as a flat list of kernel calls.

Lecture 7 contrasts define-and-run (the graph is rebuilt by Python at every step) with
define-then-run (the graph is built once and executed many times); lectures 23-24 compile such
a graph into a list of kernels over preallocated memory. ``step = ndl.compile(fn)`` does this
for a needle step function (forward, backward and optimizer update): it **traces** calls of
``fn`` eagerly while recording every call into the device modules (``ewise_binary``,
``matmul_strided``, ``adam_update``...: the kernels of ``protocol.py``), and once two
consecutive calls issued the same kernels it **replays** that list on new inputs of the same
shapes, with no Tensor, no graph and no Python op code run.

What a recorded buffer becomes in the replay (its *slot*):

* an **input**: the array of a Tensor passed to the step (rebound at every call);
* **external**: a buffer that existed before the call (parameters, optimizer state): the same
  buffer, updated in place by the replay exactly as the eager kernels update it;
* **carried**: state that the step rebinds in Python (batch norm's running averages are a new
  Tensor each step): the replay reads the Tensor the module holds at the time of the call,
  computes the new value and copies it into that Tensor's buffer;
* **kept**: a temporary that Python still holds after the call (``p.grad``, a saved
  activation): the replay writes into that same buffer, so Python sees the new values;
* **pooled**: every other temporary. Pooled slots share a few preallocated buffers: a buffer
  whose slot is dead is handed to the next slot of the same size (lecture 12's memory reuse);
  :meth:`CompiledStep.memory_plan` reports the counts.

The outputs (Tensors returned by ``fn``) come back as fresh, detached Tensors at every call.

Guards: nothing wrong is ever replayed, the step falls back to tracing (re-traces) instead:

* a new **signature** of the inputs (shape, strides, dtype, device of each Tensor, the value of
  every non-Tensor argument, grad mode) selects another captured program or traces a new one;
* the **Python state the step reads**: the numbers, flags and Tensor/array identities held by
  the modules, optimizers, closure variables and globals that ``fn`` names (a changed ``lr``,
  ``model.eval()``, a flag that picks a Python branch, a parameter rebound with ``p.data =``),
  plus objects passed in ``watch=``; an int that grows by one per call (Adam's ``t``) is a
  *counter*: the replay advances it and passes its value to the kernels that took it;
* **device values read by Python** (``x.numpy()`` inside the step, e.g. batch norm's test
  whether a statistic's adjoint is zero) are read again during the replay and compared with the
  traced value; a difference abandons the replay (before any buffer that outlives the call was
  written) and re-traces;
* random numbers (``init.rand``/``randn``, dropout masks) are recorded as a draw: the replay
  draws fresh numbers from numpy's global RNG in the same order as the eager step would.

Limits (stated honestly): Python state that ``fn`` reaches only indirectly (an object not named
by ``fn``, a module attribute of another module) is not guarded: pass it in ``watch=``, or call
:meth:`CompiledStep.reset`; host data (numpy arrays) turned into arrays inside the step is
captured as a constant when two traced calls gave the same bytes; a step whose kernels keep
changing after ``max_traces`` traced calls runs eagerly from then on (``stats`` says why). A
device value read in Python is compared exactly, so a step that reads a value that changes every
call (a loss printed inside the step) re-traces every call and ends up eager. Outputs are
detached (no graph).
Tracing holds every buffer of the traced call until it ends (more memory than eager, three
times). Only the ``nd`` backend is captured (``NEEDLE_BACKEND=np`` runs ``fn`` eagerly).
Recording patches the device objects for the tracing thread only; other threads run eagerly.
"""

from __future__ import annotations

import gc
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .. import autograd, backend_selection
from ..autograd import Tensor
from ..backend_ndarray import fused_spec

__all__ = ["compile", "CompiledStep"]

# Buffer arguments each kernel writes (unknown kernels: every buffer argument counts as written):
# the protocol's array functions write their ``out``; each fused kernel its declared outputs and
# the inputs it updates in place (fused_spec, where the kernels are specified).
_WRITES: Dict[str, Tuple[str, ...]] = {
    **dict.fromkeys(
        (
            "from_numpy",
            "fill",
            "compact",
            "ewise_setitem",
            "scalar_setitem",
            "ewise_binary",
            "ewise_scalar",
            "ewise_unary",
            "reduce",
            "matmul_strided",
            "matmul",
        ),
        ("out",),
    ),
    **{
        k.name: tuple(o.name for o in k.outputs) + k.updates
        for k in fused_spec.KERNELS.values()
        if k.name is not None
    },
}
# Module functions never recorded (bookkeeping, not computation).
_SKIP = {"memory_stats", "reset_peak", "cache_info", "cache_clear", "is_available"}
# Simple Python values whose equality the guard checks.
_SCALARS = (bool, int, float, str, type(None), np.integer, np.floating, np.bool_)

_active = threading.local()  # .tracing: a trace is running in this thread


class CaptureError(Exception):
    """Internal: why a traced call cannot become a program (the step then stays eager)."""


# ---- the recorder -------------------------------------------------------------------------------
@dataclass
class _Trace:
    """One traced call: the kernel calls with their buffers as keys, and what they refer to.

    Buffer keys: ("in", j) the j-th input array, ("tmp", k) the k-th buffer allocated in the
    call, ("ext", i) the i-th buffer that existed before it. Ops: ("alloc", k, dev, size),
    ("call", dev, name, args), ("read", dev, args, value), ("rand", dev, kind, shape, k)."""

    inputs: Dict[int, int]
    ops: List[tuple] = field(default_factory=list)
    tmp: List[Any] = field(default_factory=list)
    ext: List[Any] = field(default_factory=list)
    ids: Dict[int, tuple] = field(default_factory=dict)
    outputs: Any = None
    kept: set = field(default_factory=set)
    before: Dict[tuple, Any] = field(default_factory=dict)
    after: Dict[tuple, Any] = field(default_factory=dict)

    def key(self, handle: Any) -> tuple:
        k = self.ids.get(id(handle))
        if k is None:
            j = self.inputs.get(id(handle))
            if j is not None:
                k = ("in", j)
            else:
                k = ("ext", len(self.ext))
                self.ext.append(handle)
            self.ids[id(handle)] = k
        return k

    def new_tmp(self, handle: Any) -> int:
        self.tmp.append(handle)
        k = len(self.tmp) - 1
        self.ids[id(handle)] = ("tmp", k)
        return k


def _devices() -> list:
    from ..backend_ndarray.device import all_devices

    return [d for d in all_devices() if d.enabled()]


class _Recorder:
    """Installs recording wrappers on every enabled device (shadowing the cached module
    functions in the device object's ``__dict__``) for the current thread, and removes them."""

    def __init__(self, trace: _Trace):
        self.trace = trace
        self.thread = threading.get_ident()
        self.depth = 0
        self.saved: List[Tuple[Any, str, Any]] = []
        self.array_types: tuple = ()

    def __enter__(self) -> "_Recorder":
        from ..backend_ndarray import protocol

        names = [n for n in vars(protocol.DeviceModule) if not n.startswith("_")]
        types_ = []
        for dev in _devices():
            types_.append(dev.mod.Array)
            builtins_ = [
                n
                for n in dir(dev.mod)
                if not n.startswith("_")
                and isinstance(getattr(dev.mod, n), types.BuiltinFunctionType)
            ]
            for name in names + builtins_:
                if name in _SKIP or not callable(getattr(dev.mod, name, None)):
                    continue
                if any(d is dev and n == name for d, n, _ in self.saved):
                    continue
                self._patch(dev, name, self._wrap(dev, name, getattr(dev.mod, name)))
            for kind in ("rand", "randn"):
                self._patch(dev, kind, self._wrap_rand(dev, kind, getattr(dev, kind)))
        self.array_types = tuple(t for t in types_ if isinstance(t, type))
        return self

    def _patch(self, dev: Any, name: str, fn: Callable) -> None:
        self.saved.append((dev, name, dev.__dict__.get(name, _MISSING)))
        dev.__dict__[name] = fn

    def __exit__(self, *exc: object) -> None:
        for dev, name, old in reversed(self.saved):
            if old is _MISSING:
                dev.__dict__.pop(name, None)
            else:
                dev.__dict__[name] = old

    def _wrap(self, dev: Any, name: str, fn: Callable) -> Callable:
        def recorded(*args: Any) -> Any:
            if self.depth or threading.get_ident() != self.thread:
                return fn(*args)
            self.depth += 1
            try:
                result = fn(*args)
            finally:
                self.depth -= 1
            trace = self.trace
            if name == "Array":
                trace.ops.append(("alloc", trace.new_tmp(result), dev, int(args[0])))
            elif name == "to_numpy":
                trace.ops.append(("read", dev, self._encode(args), np.array(result)))
            else:
                trace.ops.append(("call", dev, name, self._encode(args)))
            return result

        return recorded

    def _wrap_rand(self, dev: Any, kind: str, fn: Callable) -> Callable:
        def recorded(*shape: int, dtype: str = "float32") -> Any:
            if self.depth or threading.get_ident() != self.thread:
                return fn(*shape, dtype=dtype)
            self.depth += 1
            try:
                result = fn(*shape, dtype=dtype)
            finally:
                self.depth -= 1
            k = self.trace.new_tmp(result._handle)
            self.trace.ops.append(("rand", dev, kind, tuple(int(s) for s in shape), k))
            return result

        return recorded

    def _encode(self, args: Sequence[Any]) -> tuple:
        out: List[Tuple[str, Any]] = []
        for a in args:
            if isinstance(a, self.array_types):
                out.append(("buf", self.trace.key(a)))
            elif isinstance(a, np.ndarray):
                out.append(("np", np.array(a)))
            else:
                out.append(("val", a))
        return tuple(out)


_MISSING = object()


# ---- the Python state a step reads --------------------------------------------------------------
def _state_objects(fn: Callable, extra: Iterable[Any]) -> List[Tuple[Any, Any, Any]]:
    """(container, key, kind) entries naming what ``fn`` can read: closure cells, the globals its
    code names, a bound method's object, plus ``extra``; modules and optimizers are expanded
    into their attributes (submodules recursively)."""
    from ..nn import Module
    from ..optim import Optimizer

    entries: List[Tuple[Any, Any, Any]] = []
    seen: set = set()

    def visit(obj: Any, depth: int = 0) -> None:
        if id(obj) in seen or depth > 8:
            return
        if isinstance(obj, (Module, Optimizer)):
            seen.add(id(obj))
            for name, value in vars(obj).items():
                entries.append((obj, name, "attr"))
                visit_value(value, depth + 1)
        elif isinstance(obj, types.FunctionType):
            seen.add(id(obj))
            visit_function(obj, depth + 1)
        elif isinstance(obj, types.MethodType):
            visit(obj.__self__, depth + 1)
            visit(obj.__func__, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, (Tensor, type, types.ModuleType)):
            # a plain object (a dataclass holding step functions): the callables and modules
            # it holds, not its other attributes
            seen.add(id(obj))
            for value in vars(obj).values():
                if callable(value) or isinstance(value, (Module, Optimizer)):
                    visit(value, depth + 1)

    def visit_value(value: Any, depth: int) -> None:
        if isinstance(value, (list, tuple)):
            for v in value:
                visit(v, depth)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v, depth)
        else:
            visit(value, depth)

    def names(code: types.CodeType) -> set:
        found = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                found |= names(c)
        return found

    def visit_function(f: types.FunctionType, depth: int) -> None:
        for cell in f.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            entries.append((cell, "cell_contents", "attr"))
            visit_value(value, depth)
        g = f.__globals__
        for name in sorted(names(f.__code__)):
            if name in g and not isinstance(g[name], types.ModuleType):
                entries.append((g, name, "item"))
                visit_value(g[name], depth)
        for d in f.__defaults__ or ():
            visit_value(d, depth)

    visit(fn)
    for obj in extra:
        visit_value(obj, 0)
    return entries


def _describe(value: Any) -> Any:
    """What the guard compares for one state value: the value for numbers and strings, the
    object's identity (and its array's) for Tensors and arrays, a summary for containers;
    callables and other objects are compared by identity."""
    from ..backend_ndarray import NDArray

    if isinstance(value, _SCALARS):
        return ("=", value)
    if isinstance(value, Tensor):
        return ("T", id(value), id(value.cached_data), value, value.cached_data)
    if isinstance(value, NDArray):
        return ("A", id(value), id(value._handle), value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_describe(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _describe(v)) for k, v in value.items()))
    return ("is", id(value), value)


def _form(desc: Any) -> Any:
    """A description with object identities dropped: what a step may not change in Python
    (numbers, flags, container lengths), since a replay runs no Python. Rebinding a Tensor is
    fine: the buffers behind it are written by the replay (kept or carried slots)."""
    if desc[0] in ("T", "A", "is"):
        return desc[0]
    if desc[0] in ("list", "tuple"):
        return (desc[0], tuple(_form(d) for d in desc[1]))
    if desc[0] == "dict":
        return ("dict", tuple((k, _form(d)) for k, d in desc[1]))
    return desc


def _snapshot(entries: List[Tuple[Any, Any, Any]]) -> Dict[tuple, Any]:
    """The description of every entry's value now (entries that vanished are left out)."""
    out = {}
    for container, key, kind in entries:
        try:
            value = getattr(container, key) if kind == "attr" else container[key]
        except (AttributeError, KeyError):
            continue
        out[(id(container), key)] = (container, key, kind, _describe(value))
    return out


def _strip(desc: Any) -> Any:
    """A description without the objects it keeps alive (for comparisons)."""
    if isinstance(desc, tuple) and desc and desc[0] in ("T", "A", "is"):
        return desc[:3] if desc[0] != "is" else desc[:2]
    if isinstance(desc, tuple) and desc and desc[0] in ("list", "tuple"):
        return (desc[0], tuple(_strip(d) for d in desc[1]))
    if isinstance(desc, tuple) and desc and desc[0] == "dict":
        return ("dict", tuple((k, _strip(d)) for k, d in desc[1]))
    return desc


# ---- the program --------------------------------------------------------------------------------
@dataclass
class _Program:
    """A captured step: the kernel list with its buffers bound, and the checks before a replay."""

    ops: List[tuple]  # ("call", dev, name, fn, args) / ("read", ...) / ("rand", ...) over slots
    # per slot: ("in", j) ("ext", h) ("kept", h) ("carry", h) ("pool", size, dev)
    slots: List[tuple]
    outputs: Any
    carries: List[Tuple[int, int]]  # (pooled slot computed, carried slot whose buffer gets it)
    counters: List[Tuple[Any, Any, str]]  # (container, key, "attr"/"item") advanced per call
    counter_uses: List[Tuple[int, int, int]]  # (op index, arg position, counter index)
    guard: List[Tuple[Any, Any, str, Any, Any]]  # (container, key, kind, expected, the objects)
    pool: List[Any] = field(default_factory=list)
    pool_of: Dict[int, int] = field(default_factory=dict)
    baked: Optional[list] = None
    replays: int = 0

    def lines(self) -> List[str]:
        """One line per kernel call: ``name(arguments)`` with buffers named by their slots."""
        out = []
        for op in self.ops:
            if op[0] == "call":
                _, dev, name, _fn, args = op
                out.append(f"{dev.name}.{name}({', '.join(self._arg(a) for a in args)})")
            elif op[0] == "read":
                out.append(f"{op[1].name}.to_numpy({self._arg(op[3][0])}, ...)  # guard")
            else:
                out.append(f"{op[1].name}.{op[2]}{op[3]} -> {self._slot(op[4])}  # fresh draw")
        return out

    def _slot(self, s: int) -> str:
        kind = self.slots[s][0]
        if kind == "pool":
            return f"buf{self.pool_of[s]}" if s in self.pool_of else f"tmp{s}"
        return f"{kind}{s}"

    def _arg(self, a: tuple) -> str:
        if a[0] == "slot":
            return self._slot(a[1])
        v = a[1]
        if isinstance(v, float):
            return f"{v:.6g}"
        return repr(v)


def _plan_memory(ops: List[tuple], slots: List[tuple], live_to_end: set) -> Dict[int, int]:
    """Pool index of each pooled slot: slots whose lifetimes [first use, last use] do not
    overlap share a buffer of the same size and device (greedy, in program order); the slots
    in ``live_to_end`` (outputs, carried state) live until the end of the step."""
    last: Dict[int, int] = {}
    for i, op in enumerate(ops):
        for s in _op_slots(op):
            if slots[s][0] == "pool":
                last[s] = i
    end = len(ops)
    for s in live_to_end:
        last[s] = end
    free: Dict[tuple, List[int]] = {}
    pool_of: Dict[int, int] = {}
    sizes: List[tuple] = []
    release: Dict[int, List[int]] = {}
    for s, i in last.items():
        release.setdefault(i, []).append(s)
    for i, op in enumerate(ops):
        for s in _op_slots(op):
            if slots[s][0] == "pool" and s not in pool_of:
                size_key = (slots[s][1], slots[s][2].name)
                stack = free.get(size_key)
                if stack:
                    pool_of[s] = stack.pop()
                else:
                    pool_of[s] = len(sizes)
                    sizes.append(size_key)
        for s in release.get(i, ()):
            if s in pool_of:
                free.setdefault((slots[s][1], slots[s][2].name), []).append(pool_of[s])
    return pool_of


def _op_slots(op: tuple) -> List[int]:
    if op[0] == "call":
        return [a[1] for a in op[4] if a[0] == "slot"]
    if op[0] == "read":
        return [a[1] for a in op[3] if a[0] == "slot"]
    return [op[4]]


def _build(prev2: Optional[_Trace], prev: _Trace, cur: _Trace) -> _Program:
    """The program of ``cur``, checked against ``prev`` (the call before it): the same kernels
    in the same order, scalars equal or explained by a counter, each external buffer the same
    or the state carried from the call before (``prev2`` tells which temporary it was)."""
    if len(prev.ops) != len(cur.ops):
        raise CaptureError(f"two calls issued {len(prev.ops)} and {len(cur.ops)} device calls")
    counters = _counters(prev, cur)
    for k, (_c, key, _kind, desc) in cur.after.items():
        before = cur.before.get(k)
        if before is not None and k not in counters and _form(before[3]) != _form(desc):
            raise CaptureError(
                f"the step changes the Python value {key!r} in a way a replay cannot repeat "
                "(a number, flag or container it reads and writes)"
            )
    slot_of: Dict[tuple, int] = {}
    slots: List[tuple] = []
    carried: Dict[int, int] = {}  # tmp index in cur -> carried slot

    def new_slot(key: tuple, desc: tuple) -> int:
        slot_of[key] = len(slots)
        slots.append(desc)
        return slot_of[key]

    def slot(key: tuple, other: tuple, where: str) -> int:
        if key[0] != other[0]:
            raise CaptureError(f"{where}: a buffer changed role ({other[0]} -> {key[0]})")
        if key[0] == "ext":
            h, h0 = cur.ext[key[1]], prev.ext[other[1]]
            if h is not h0:
                # state rebound by Python: this call reads what the call before created
                k1 = prev.ids.get(id(h))
                k0 = prev2.ids.get(id(h0)) if prev2 is not None else None
                if not (k1 and k0 and k1[0] == "tmp" and k0 == k1 and k1[1] in cur.kept):
                    raise CaptureError(f"{where}: reads a different existing buffer each call")
                if key not in slot_of:
                    carried[k1[1]] = new_slot(key, ("carry", cur.tmp[k1[1]]))
                return slot_of[key]
        elif key != other:
            raise CaptureError(f"{where}: buffers differ between calls ({other} -> {key})")
        return slot_of[key] if key in slot_of else new_slot(key, _slot_desc(cur, key))

    ops: List[tuple] = []
    counter_uses: List[Tuple[int, int, int]] = []
    tmp_info: Dict[int, Tuple[int, Any]] = {}  # tmp index -> (size, device)
    for i, (a, b) in enumerate(zip(prev.ops, cur.ops)):
        what = b[2] if b[0] == "call" else b[0]
        where = f"device call {i} ({what})"
        if a[0] != b[0] or (a[0] == "call" and (a[1] is not b[1] or a[2] != b[2])):
            raise CaptureError(f"{where}: the kernels differ between calls")
        if b[0] == "alloc":
            if a[1] != b[1] or a[2] is not b[2] or a[3] != b[3]:
                raise CaptureError(f"{where}: allocations differ between calls")
            tmp_info[b[1]] = (b[3], b[2])
            continue
        if b[0] == "rand":
            if a[1] is not b[1] or a[2:] != b[2:]:
                raise CaptureError(f"{where}: random draws differ between calls")
            tmp_info[b[4]] = (int(np.prod(b[3])), b[1])
            ops.append(("rand", b[1], b[2], b[3], slot(("tmp", b[4]), ("tmp", a[4]), where)))
            continue
        if b[1] is not a[1]:
            raise CaptureError(f"{where}: the device differs between calls")
        args_a, args_b = (a[3], b[3]) if b[0] == "call" else (a[2], b[2])
        if len(args_a) != len(args_b):
            raise CaptureError(f"{where}: argument counts differ")
        args = []
        for pos, (x, y) in enumerate(zip(args_a, args_b)):
            if x[0] != y[0]:
                raise CaptureError(f"{where}: argument {pos} changed kind")
            if y[0] == "buf":
                args.append(("slot", slot(y[1], x[1], where)))
                continue
            if y[0] == "np":
                if x[1].shape != y[1].shape or not np.array_equal(x[1], y[1], equal_nan=True):
                    raise CaptureError(f"{where}: host data (numpy) differs between calls")
            elif not _same(x[1], y[1]):
                n = _counter_for(counters, prev, cur, x[1], y[1])
                if n is None:
                    raise CaptureError(
                        f"{where}: argument {pos} changed between calls ({x[1]!r} -> {y[1]!r}) "
                        "and no counter of the guarded state explains it"
                    )
                counter_uses.append((len(ops), pos, n))
            args.append(("val", y[1]))
        if b[0] == "call":
            ops.append(("call", b[1], b[2], getattr(b[1].mod, b[2]), tuple(args)))
        else:
            ops.append(("read", b[1], b[1].mod.to_numpy, tuple(args), b[3]))
    outputs = _map_outputs(
        cur.outputs,
        lambda key: slot_of[key] if key in slot_of else new_slot(key, _slot_desc(cur, key)),
    )
    # temporaries: pooled, or kept (Python holds them); carried state is pooled and copied
    carries = []
    for s, desc in enumerate(slots):
        if desc[0] == "tmp":
            k = desc[1]
            size, dev = tmp_info[k]
            if k in carried:
                carries.append((s, carried[k]))
                slots[s] = ("pool", size, dev)
            elif k in cur.kept:
                slots[s] = ("kept", cur.tmp[k])
            else:
                slots[s] = ("pool", size, dev)
    # a replay can be abandoned at a read only before it wrote a buffer that outlives the call
    persistent = {s for s, d in enumerate(slots) if d[0] in ("ext", "in", "carry")}
    last_safe = len(ops)
    for i, op in enumerate(ops):
        if op[0] == "call" and set(_written(op)) & persistent:
            last_safe = i
            break
    if any(op[0] == "read" and i > last_safe for i, op in enumerate(ops)):
        raise CaptureError(
            "the step reads a device value in Python after updating its state (e.g. the loss "
            "read after the optimizer step): a replay could not check it safely"
        )
    # carried state held by a module attribute is looked up at every replay (another program,
    # for another input shape, may have rebound it since): its identity is not guarded
    owned = set()
    for _src, dst in carries:
        handle = slots[dst][1]
        for k, (c, key, kind, desc) in cur.after.items():
            nd = desc[4] if desc[0] == "T" else None
            if nd is not None and nd._handle is handle and nd.is_compact():
                slots[dst] = ("carry", None, (c, key, kind, handle.size, nd.device))
                owned.add(k)
                break
    guard = []
    for k, (c, key, kind, desc) in cur.after.items():
        if k not in counters and k not in owned:
            guard.append((c, key, kind, _strip(desc), desc))
    program = _Program(
        ops=ops,
        slots=slots,
        outputs=outputs,
        carries=carries,
        counters=[counters[k] for k in counters],
        counter_uses=counter_uses,
        guard=guard,
    )
    live_to_end = set(_output_slots(outputs)) | {s for s, _ in carries}
    program.pool_of = _plan_memory(ops, slots, live_to_end)
    return program


def _slot_desc(trace: _Trace, key: tuple) -> tuple:
    if key[0] == "in":
        return ("in", key[1])
    if key[0] == "ext":
        return ("ext", trace.ext[key[1]])
    return ("tmp", key[1])


def _counters(prev: _Trace, cur: _Trace) -> Dict[tuple, Tuple[Any, Any, str]]:
    """Ints of the guarded state that grew by exactly one in each of the two calls."""
    found = {}
    for k, (c, key, kind, e1) in cur.after.items():
        descs = [t.get(k) for t in (prev.before, prev.after, cur.before)]
        if any(d is None for d in descs):
            continue
        d0, d1, e0 = (d[3] for d in descs)  # type: ignore[index]
        if all(d[0] == "=" and type(d[1]) is int for d in (d0, d1, e0, e1)):
            if d1[1] - d0[1] == 1 and e1[1] - e0[1] == 1 and e0 == d1:
                found[k] = (c, key, kind)
    return found


def _counter_for(
    counters: Dict[tuple, Tuple[Any, Any, str]], prev: _Trace, cur: _Trace, x: Any, y: Any
) -> Optional[int]:
    """The index of the counter whose values after the two calls were ``x`` and ``y``."""
    if type(x) is not int or type(y) is not int:
        return None
    for n, k in enumerate(counters):
        if prev.after[k][3][1] == x and cur.after[k][3][1] == y:
            return n
    return None


def _same(x: Any, y: Any) -> bool:
    if type(x) is not type(y):
        return False
    if isinstance(x, float) and x != x:
        return y != y
    return bool(x == y)


def _written(op: tuple) -> List[int]:
    _, dev, name, _fn, args = op
    written = _WRITES.get(name)
    if written is None:
        return [a[1] for a in args if a[0] == "slot"]
    params = _param_names(dev, name)
    return [a[1] for p, a in zip(params, args) if a[0] == "slot" and p in written]


_PARAMS: Dict[str, List[str]] = {}


def _param_names(dev: Any, name: str) -> List[str]:
    names = _PARAMS.get(name)
    if names is None:
        import inspect

        from ..backend_ndarray import protocol

        names = list(inspect.signature(getattr(protocol.DeviceModule, name)).parameters)[1:]
        _PARAMS[name] = names
    return names


def _map_outputs(out: Any, f: Callable[[tuple], int]) -> Any:
    if isinstance(out, tuple) and out and out[0] == "tensor":
        return ("tensor", f(out[1])) + out[2:]
    if isinstance(out, tuple) and out and out[0] in ("tuple", "list"):
        return (out[0], tuple(_map_outputs(o, f) for o in out[1]))
    return out


def _output_slots(out: Any) -> List[int]:
    if out[0] == "tensor":
        return [out[1]]
    if out[0] in ("tuple", "list"):
        return [s for o in out[1] for s in _output_slots(o)]
    return []


# ---- the compiled step --------------------------------------------------------------------------
class _Replay(Exception):
    """Internal: a replay was abandoned (a guard failed) before writing persistent state."""


class CompiledStep:
    """A step function captured by :func:`compile`; call it like the function.

    ``stats`` counts ``traces`` (eager calls that were recorded), ``replays``, ``eager`` calls
    (not captured), ``retraces`` (a program dropped by a guard) and keeps the ``reasons``.
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
        self._programs: Dict[tuple, _Program] = {}
        self._pending: Dict[tuple, List[_Trace]] = {}
        self._given_up: Dict[tuple, str] = {}
        self._short: Dict[tuple, int] = {}  # programs in a row dropped after < 2 replays
        self.__doc__ = getattr(fn, "__doc__", None)

    def reset(self) -> None:
        """Forget every captured program (the next calls trace again)."""
        self._programs.clear()
        self._pending.clear()
        self._given_up.clear()
        self._short.clear()

    @property
    def program(self) -> Optional[_Program]:
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
        if backend_selection.BACKEND != "nd" or getattr(_active, "tracing", False):
            return self._eager(args, kwargs, None)
        try:
            sig, handles = _signature(args, kwargs)
        except CaptureError as exc:
            return self._eager(args, kwargs, str(exc))
        if sig in self._given_up:
            return self._eager(args, kwargs, None)
        program = self._programs.get(sig)
        if program is not None:
            reason = _check_guard(program)
            if reason is None:
                try:
                    result = self._replay(program, handles)
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
                self._given_up[sig] = f"{short} programs in a row failed their guard: {reason}"
                return self._eager(args, kwargs, self._given_up[sig])
        return self._trace(sig, args, kwargs, handles)

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
        entries = _state_objects(self.fn, self.watch)
        trace = _Trace(inputs={id(h): j for j, h in enumerate(handles)})
        trace.before = _snapshot(entries)
        _active.tracing = True
        try:
            with _Recorder(trace):
                result = self.fn(*args, **kwargs)
                try:  # inside the recorder: realizing a lazy output runs kernels
                    trace.outputs, arrays = _describe_outputs(result, trace)
                except CaptureError as exc:
                    self._given_up[sig] = str(exc)
                    self._note(str(exc))
                    self.stats["eager"] += 1
                    return result  # this call ran eagerly; the next ones will too
        finally:
            _active.tracing = False
        self.stats["traces"] += 1
        trace.after = _snapshot(entries)
        del result
        gc.collect()
        trace.kept = _kept(trace.tmp, arrays)
        pending = self._pending.setdefault(sig, [])
        pending.append(trace)
        if len(pending) >= 2:
            prev2 = pending[-3] if len(pending) >= 3 else None
            try:
                program = _build(prev2, pending[-2], pending[-1])
            except CaptureError as exc:
                self._note(str(exc))
                if len(pending) >= self.max_traces:
                    self._given_up[sig] = str(exc)
                    del self._pending[sig]
                else:
                    del pending[:-2]
            else:
                del self._pending[sig]
                if len(self._programs) >= self.cache:
                    self._programs.pop(next(iter(self._programs)))
                self._programs[sig] = program
        return _rebuild(trace.outputs, lambda key: arrays[key]._handle)

    def _replay(self, p: _Program, handles: List[Any]) -> Any:
        from ..backend_ndarray import NDArray

        if p.baked is None:
            _bake(p)
        assert p.baked is not None
        ops, bufs, inputs = p.baked
        for s, j in inputs:
            bufs[s] = handles[j]
        for s, (c, k, kind, size, device) in _owned_state(p):
            value = getattr(c, k, None) if kind == "attr" else c.get(k)
            data = value.cached_data if isinstance(value, Tensor) else None
            if not (
                isinstance(data, NDArray)
                and data.device == device
                and data.is_compact()
                and data._handle.size == size
            ):
                raise _Replay(f"the state {k!r} is no longer a compact Tensor of {size} elements")
            bufs[s] = data._handle
        values = [(getattr(c, k) if kind == "attr" else c[k]) + 1 for c, k, kind in p.counters]
        for kind, fn, args, patch in ops:
            if patch:
                args = list(args)
                for pos, source, n in patch:
                    args[pos] = bufs[n] if source == 0 else values[n]
            if kind == 1:  # a device value Python read: it must be what the trace read
                if not np.array_equal(fn(*args[:-1]), args[-1], equal_nan=True):
                    raise _Replay("a device value the step reads in Python changed")
            else:
                fn(*args)
        for src, dst in p.carries:
            size, dev = p.slots[src][1], p.slots[src][2]
            dev.compact(bufs[src], bufs[dst], (size,), (1,), 0)
        for (c, k, kind), v in zip(p.counters, values):
            if kind == "attr":
                setattr(c, k, v)
            else:
                c[k] = v
        return _rebuild(p.outputs, bufs.__getitem__)


def _owned_state(p: _Program) -> List[Tuple[int, tuple]]:
    """(slot, (container, key, kind, size, device)) of the carried state read from its owner."""
    return [(s, d[2]) for s, d in enumerate(p.slots) if d[0] == "carry" and d[1] is None]


def _kept(tmp: List[Any], arrays: Dict[Any, Any]) -> set:
    """Indices of the temporaries something besides the trace (and the outputs' arrays, which
    are copied) still references after the call."""
    probe = [object()]
    base = sys.getrefcount(probe[0])
    held: Dict[int, int] = {}
    for a in arrays.values():
        held[id(a._handle)] = held.get(id(a._handle), 0) + 1
    kept = set()
    for k in range(len(tmp)):
        if sys.getrefcount(tmp[k]) - held.get(id(tmp[k]), 0) > base:
            kept.add(k)
    return kept


def _bake(p: _Program) -> None:
    """Allocate the pool and turn the ops into (kind, function, args, patches) with every fixed
    buffer in place; a patch (position, 0, slot) puts an input's buffer, (position, 1, n) the
    value of counter n."""
    sizes: Dict[int, tuple] = {}
    for s, b in p.pool_of.items():
        sizes[b] = (p.slots[s][1], p.slots[s][2])
    p.pool = [sizes[b][1].Array(sizes[b][0]) for b in range(len(sizes))]
    bufs: List[Any] = []
    inputs: List[Tuple[int, int]] = []
    for s, d in enumerate(p.slots):
        if d[0] == "pool":
            bufs.append(p.pool[p.pool_of[s]])
        elif d[0] == "in":
            bufs.append(None)
            inputs.append((s, d[1]))
        else:
            bufs.append(d[1])  # None for state looked up at each replay
    input_slots = {s for s, _ in inputs} | {s for s, _ in _owned_state(p)}
    baked = []
    for i, op in enumerate(p.ops):
        if op[0] == "rand":
            _, dev, kind, shape, s = op
            draw = np.random.rand if kind == "rand" else np.random.randn

            def fresh(out: Any, dev: Any = dev, shape: tuple = shape, draw: Any = draw) -> None:
                dev.from_numpy(np.asarray(draw(*shape).astype("float32"), order="C"), out)

            baked.append((0, fresh, (bufs[s],), [(0, 0, s)] if s in input_slots else []))
            continue
        desc = op[4] if op[0] == "call" else op[3]
        args = [bufs[a[1]] if a[0] == "slot" else a[1] for a in desc]
        patch = [(n, 0, a[1]) for n, a in enumerate(desc) if a[0] == "slot" and a[1] in input_slots]
        patch += [(pos, 1, n) for op_i, pos, n in p.counter_uses if op_i == i]
        if op[0] == "read":
            baked.append((1, op[2], tuple(args) + (op[4],), patch))
        else:
            baked.append((0, op[3], tuple(args), patch))
    p.baked = [baked, bufs, inputs]


def _check_guard(p: _Program) -> Optional[str]:
    for c, key, kind, expected, _objects in p.guard:
        try:
            value = getattr(c, key) if kind == "attr" else c[key]
        except (AttributeError, KeyError):
            return f"{key!r} is gone"
        if _strip(_describe(value)) != expected:
            return f"{key!r} changed"
    return None


def _signature(args: tuple, kwargs: dict) -> Tuple[tuple, List[Any]]:
    """(hashable signature, input buffers) of one call's arguments."""
    from ..backend_ndarray import NDArray

    sig: List[Any] = [autograd.is_grad_enabled()]
    handles: List[Any] = []

    def one(a: Any) -> Any:
        if isinstance(a, Tensor):
            data = a.realize_cached_data()
            if not isinstance(data, NDArray):
                raise CaptureError(f"input of type {type(data).__name__} is not an NDArray")
            if any(h is data._handle for h in handles):
                raise CaptureError("two inputs share one buffer")
            handles.append(data._handle)
            return (
                "T",
                data.shape,
                data.strides,
                data._offset,
                data._handle.size,
                data.device.name,
                a.dtype,
                a.requires_grad,
            )
        if isinstance(a, _SCALARS):
            return ("=", type(a).__name__, a)
        if isinstance(a, (tuple, list)):
            return (type(a).__name__, tuple(one(x) for x in a))
        raise CaptureError(
            f"argument of type {type(a).__name__} cannot be guarded (pass Tensors and numbers)"
        )

    for a in args:
        sig.append(one(a))
    for k in sorted(kwargs):
        sig.append((k, one(kwargs[k])))
    return tuple(sig), handles


def _describe_outputs(result: Any, trace: _Trace) -> Tuple[Any, Dict[Any, Any]]:
    """(structure, arrays) of a step's result: Tensors become ("tensor", buffer key, shape,
    strides, offset) and their arrays are returned by key, to be copied."""
    from ..backend_ndarray import NDArray

    arrays: Dict[Any, Any] = {}

    def walk(r: Any) -> Any:
        if isinstance(r, Tensor):
            data = r.realize_cached_data()
            if not isinstance(data, NDArray):
                raise CaptureError("an output is not an NDArray")
            key = trace.key(data._handle)
            arrays[key] = data
            return ("tensor", key, data.shape, data.strides, data._offset, data.device)
        if isinstance(r, (tuple, list)):
            return (type(r).__name__, tuple(walk(x) for x in r))
        if isinstance(r, _SCALARS):
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
    kernel list (see the module docstring).

    ``fn`` takes Tensors (and numbers) and returns Tensors, tuples/lists of them, or numbers;
    the compiled step returns the same structure with detached Tensors. ``watch``: more objects
    whose state the guard checks (modules, optimizers). ``max_traces``: traced calls per input
    signature before giving up (then eager); ``cache``: programs kept (one per signature).
    """
    return CompiledStep(fn, watch=watch, max_traces=max_traces, cache=cache)
