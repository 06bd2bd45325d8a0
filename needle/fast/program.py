"""A captured program: built from traced calls that agree, its memory plan, and its baked form.

What each recorded buffer becomes (its *slot*) is described in ``needle/fast/compile.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import guards
from .guards import CaptureError
from .recording import Trace, written


@dataclass
class Program:
    """A captured step: the kernel list with its buffers bound, and the checks before a replay."""

    ops: List[tuple]  # ("call", dev, name, fn, args) / ("read", ...) / ("rand", ...) over slots
    # per slot: ("in", j) ("ext", h) ("kept", h) ("carry", h) ("pool", size, dev); carried
    # state found through its owner: ("carry", None, owner) and ("fresh", size, dev), the
    # new array allocated by each replay (see owned_entries)
    slots: List[tuple]
    outputs: Any
    carries: List[Tuple[int, int]]  # (slot computed, carried slot: its owner or buffer gets it)
    counters: List[Tuple[Any, Any, str]]  # (container, key, "attr"/"item") advanced per call
    counter_uses: List[Tuple[int, int, int]]  # (op index, arg position, counter index)
    guard: List[Tuple[Any, Any, str, tuple]]  # (container, key, kind, guards.expect(...))
    # (tensor, form of its grad before the traced call, grad after it, re-bound by a replay)
    grads: List[Tuple[Any, Any, Any, bool]] = field(default_factory=list)
    pool: List[Any] = field(default_factory=list)
    pool_of: Dict[int, int] = field(default_factory=dict)
    baked: Optional[list] = None
    replays: int = 0
    draws_before_read: bool = False  # a random draw precedes a read (a replay may be abandoned)

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


# ---- memory -------------------------------------------------------------------------------------
def plan_memory(ops: List[tuple], slots: List[tuple], live_to_end: set) -> Dict[int, int]:
    """Pool index of each pooled slot: slots whose lifetimes [first use, last use] do not
    overlap share a buffer of the same size and device (greedy, in program order); the slots
    in ``live_to_end`` (outputs, carried state) live until the end of the step."""
    last: Dict[int, int] = {}
    for i, op in enumerate(ops):
        for s in _op_slots(op):
            if slots[s][0] == "pool":
                last[s] = i
    for s in live_to_end:
        last[s] = len(ops)
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


# ---- building ------------------------------------------------------------------------------------
class _Slots:
    """The slots of a program being built from ``cur``, checked against ``prev`` (and, for
    carried state that no guarded entry holds, ``prev2``, which tells which temporary a carried
    buffer was)."""

    def __init__(self, prev2: Optional[Trace], prev: Trace, cur: Trace) -> None:
        self.prev2, self.prev, self.cur = prev2, prev, cur
        self.slot_of: Dict[tuple, int] = {}
        self.slots: List[tuple] = []
        self.carried: Dict[int, int] = {}  # tmp index in cur -> carried slot
        self.holders: Optional[tuple] = None  # (cur before, cur after, prev before) by buffer
        self.owner: Dict[int, tuple] = {}  # tmp index in cur -> the entry shown to hold it

    def new(self, key: tuple, desc: tuple) -> int:
        self.slot_of[key] = len(self.slots)
        self.slots.append(desc)
        return self.slot_of[key]

    def of(self, key: tuple) -> int:
        """The slot of a key of ``cur`` not compared with ``prev`` (an output)."""
        return (
            self.slot_of[key] if key in self.slot_of else self.new(key, _slot_desc(self.cur, key))
        )

    def slot(self, key: tuple, other: tuple, where: str) -> int:
        """The slot of ``key`` in ``cur``, whose counterpart in ``prev`` is ``other``."""
        if key[0] != other[0]:
            raise CaptureError(f"{where}: a buffer changed role ({other[0]} -> {key[0]})")
        if key[0] == "ext":
            h, h0 = self.cur.ext[key[1]], self.prev.ext[other[1]]
            if h is not h0:
                # state rebound by Python: this call reads what the call before created
                k1 = self.prev.ids.get(id(h))
                if not (k1 and k1[0] == "tmp" and self._rebound(h, h0, k1[1])):
                    raise CaptureError(f"{where}: reads a different existing buffer each call")
                if key not in self.slot_of:
                    self.carried[k1[1]] = self.new(key, ("carry", self.cur.tmp[k1[1]]))
                return self.slot_of[key]
        elif key != other:
            raise CaptureError(f"{where}: buffers differ between calls ({other} -> {key})")
        return self.of(key)

    def _rebound(self, h: Any, h0: Any, k: int) -> bool:
        """Whether the buffer ``h`` that ``cur`` reads (``prev``'s temporary ``k``, where
        ``prev`` read ``h0``) is state carried from call to call: an entry of the guarded state
        (an optimizer's parameter, a module's running average) held ``h0`` before ``prev``,
        ``h`` before ``cur`` and ``cur``'s temporary ``k`` after it, compact (a replay looks
        that entry up and writes its buffer); or, for state no entry holds, ``prev`` read the
        temporary ``k`` of the call before it (``prev2``) and Python keeps ``cur``'s."""
        new = self.cur.tmp[k]
        if self.holders is None:
            self.holders = tuple(
                _holders(snap) for snap in (self.cur.before, self.cur.after, self.prev.before)
            )
        before, after, earlier = self.holders
        for e in before.get(id(h), ()):
            if e in after.get(id(new), ()) and e in earlier.get(id(h0), ()):
                self.owner[k] = e
                return True
        if self.prev2 is None or k not in self.cur.kept:
            return False
        return self.prev2.ids.get(id(h0)) == ("tmp", k)


def _holders(snap: Dict[tuple, Any]) -> Dict[int, List[tuple]]:
    """The entries of a snapshot whose value is a Tensor over a whole compact buffer, by the
    id of that buffer."""
    found: Dict[int, List[tuple]] = {}
    for k, (_c, _key, _kind, desc) in snap.items():
        data = desc[4][1] if desc[0] == "T" else None
        if data is not None and hasattr(data, "buffer") and data.is_compact():
            handle, offset = data.buffer
            if offset == 0 and handle.size == data.size:
                found.setdefault(id(handle), []).append(k)
    return found


def _slot_desc(trace: Trace, key: tuple) -> tuple:
    if key[0] == "in":
        return ("in", key[1])
    if key[0] == "ext":
        return ("ext", trace.ext[key[1]])
    return ("tmp", key[1])


def build(prev2: Optional[Trace], prev: Trace, cur: Trace) -> Program:
    """The program of ``cur``, checked against ``prev`` (the call before it): the same kernels
    in the same order, scalars equal or explained by a counter, each external buffer the same
    or the state carried from the call before (held by the same entry before and after both
    calls, or, held by none, the same temporary of ``prev2`` and ``prev``)."""
    if len(prev.ops) != len(cur.ops):
        raise CaptureError(f"two calls issued {len(prev.ops)} and {len(cur.ops)} device calls")
    found = guards.counters(prev, cur)
    _check_python_changes(cur, found)
    slots = _Slots(prev2, prev, cur)
    ops, counter_uses, tmp_info = _match_ops(prev, cur, slots, found)
    outputs = _map_outputs(cur.outputs, slots.of)
    carries = _settle_temporaries(slots, tmp_info, cur)
    _check_reads(ops, slots.slots, carries)
    owners = {slots.carried[k]: e for k, e in slots.owner.items() if k in slots.carried}
    owned, loose = _owned_state(slots.slots, carries, cur, owners)
    guard, grads = _guards(cur, found, owned, loose)
    program = Program(
        ops=ops,
        slots=slots.slots,
        outputs=outputs,
        carries=carries,
        counters=[found[k] for k in found],
        counter_uses=counter_uses,
        guard=guard,
        grads=grads,
    )
    live_to_end = set(_output_slots(outputs)) | {s for s, _ in carries}
    program.pool_of = plan_memory(ops, slots.slots, live_to_end)
    return program


def _check_python_changes(cur: Trace, found: Dict[tuple, Any]) -> None:
    """A step may change no guarded Python value in a way a replay cannot repeat (counters
    are advanced by the replay, a ``grad`` is re-bound by it)."""
    for k, (c, key, kind, desc) in cur.after.items():
        before = cur.before.get(k)
        if before is None or k in found or kind == "grad":
            continue
        if guards.form(before[3]) != guards.form(desc):
            raise CaptureError(
                f"the step changes the Python value {guards.name(c, key, kind)} in a way a "
                "replay cannot repeat (a number, flag, array or container it reads and writes)"
            )


def _match_ops(
    prev: Trace, cur: Trace, slots: _Slots, found: Dict[tuple, Any]
) -> Tuple[List[tuple], List[Tuple[int, int, int]], Dict[int, Tuple[int, Any]]]:
    """(ops over slots, counter uses, tmp index -> (size, device)) of ``cur``, each op
    checked against ``prev``'s."""
    ops: List[tuple] = []
    counter_uses: List[Tuple[int, int, int]] = []
    tmp_info: Dict[int, Tuple[int, Any]] = {}
    for i, (a, b) in enumerate(zip(prev.ops, cur.ops)):
        where = f"device call {i} ({b[2] if b[0] == 'call' else b[0]})"
        if a[0] != b[0] or (a[0] == "call" and (a[1] is not b[1] or a[2] != b[2])):
            raise CaptureError(f"{where}: the kernels differ between calls")
        if b[0] == "alloc":
            if a[1] != b[1] or a[2] is not b[2] or a[3] != b[3]:
                raise CaptureError(f"{where}: allocations differ between calls")
            tmp_info[b[1]] = (b[3], b[2])
        elif b[0] == "rand":
            if a[1] is not b[1] or a[2:] != b[2:]:
                raise CaptureError(f"{where}: random draws differ between calls")
            tmp_info[b[4]] = (int(np.prod(b[3])), b[1])
            ops.append(("rand", b[1], b[2], b[3], slots.slot(("tmp", b[4]), ("tmp", a[4]), where)))
        else:
            if b[1] is not a[1]:
                raise CaptureError(f"{where}: the device differs between calls")
            args_a, args_b = (a[3], b[3]) if b[0] == "call" else (a[2], b[2])
            uses: List[Tuple[int, int]] = []
            args = _match_args(args_a, args_b, slots, where, (found, prev, cur), uses)
            counter_uses += [(len(ops), pos, n) for pos, n in uses]
            if b[0] == "call":
                ops.append(("call", b[1], b[2], getattr(b[1].mod, b[2]), args))
            else:
                ops.append(("read", b[1], b[1].mod.to_numpy, args, b[3]))
    return ops, counter_uses, tmp_info


def _match_args(
    args_a: tuple, args_b: tuple, slots: _Slots, where: str, ctx: tuple, uses: list
) -> tuple:
    """The arguments of one op of ``cur`` over slots; a scalar that differs from ``prev``'s
    must be explained by a counter (appended to ``uses`` as (position, counter index))."""
    if len(args_a) != len(args_b):
        raise CaptureError(f"{where}: argument counts differ")
    args = []
    for pos, (x, y) in enumerate(zip(args_a, args_b)):
        if x[0] != y[0]:
            raise CaptureError(f"{where}: argument {pos} changed kind")
        if y[0] == "buf":
            args.append(("slot", slots.slot(y[1], x[1], where)))
            continue
        if y[0] == "np":
            if x[1].shape != y[1].shape or not np.array_equal(x[1], y[1], equal_nan=True):
                raise CaptureError(f"{where}: host data (numpy) differs between calls")
        elif not guards.same(x[1], y[1]):
            n = guards.counter_for(ctx[0], ctx[1], ctx[2], x[1], y[1])
            if n is None:
                raise CaptureError(
                    f"{where}: argument {pos} changed between calls ({x[1]!r} -> {y[1]!r}) "
                    "and no counter of the guarded state explains it"
                )
            uses.append((pos, n))
        args.append(("val", y[1]))
    return tuple(args)


def _settle_temporaries(slots: _Slots, tmp_info: Dict[int, Tuple[int, Any]], cur: Trace) -> list:
    """Temporaries become pooled, or kept (Python holds them); carried state is pooled and
    copied into the carried buffer. Returns the carries (pooled slot, carried slot)."""
    carries = []
    for s, desc in enumerate(slots.slots):
        if desc[0] != "tmp":
            continue
        k = desc[1]
        size, dev = tmp_info[k]
        if k in slots.carried:
            carries.append((s, slots.carried[k]))
            slots.slots[s] = ("pool", size, dev)
        elif k in cur.kept:
            slots.slots[s] = ("kept", cur.tmp[k])
        else:
            slots.slots[s] = ("pool", size, dev)
    return carries


def _check_reads(ops: List[tuple], slots: List[tuple], carries: list) -> None:
    """A replay can be abandoned at a read only before it updated the state that outlives the
    call: a buffer that existed before it, or the new value of carried state (the replay
    copies that value into the state's buffer at its end, but the step had updated its state
    before reading the value: an optimizer's new parameters, now a new array each step)."""
    persistent = {s for s, d in enumerate(slots) if d[0] in ("ext", "in", "carry")}
    persistent |= {src for src, _dst in carries}
    last_safe = len(ops)
    for i, op in enumerate(ops):
        if op[0] == "call" and set(written(op)) & persistent:
            last_safe = i
            break
    if any(op[0] == "read" and i > last_safe for i, op in enumerate(ops)):
        raise CaptureError(
            "the step reads a device value in Python after updating its state (e.g. the loss "
            "read after the optimizer step): a replay could not check it safely"
        )


def _owned_state(
    slots: List[tuple], carries: list, cur: Trace, owners: Dict[int, tuple]
) -> Tuple[set, set]:
    """Carried state held by an entry (a module attribute, a ``grad``) is looked up at every
    replay (another program, for another input shape, may have rebound it since): its
    identity is not guarded, and each replay computes its new value into a new array that it
    gives the entry, as the eager step does (an optimizer's ``p.data = ...``: a snapshot
    ``Tensor(p)`` keeps the old values). Returns those entries' keys, and the ids of the
    arrays they hold after ``cur`` (a Tensor holding one elsewhere, a parameter in an
    optimizer's list, is guarded by identity only: its array is rebound by every call).
    ``owners``: the entry that :meth:`_Slots._rebound` showed to hold a carried slot's state,
    tried first."""
    owned, loose = set(), set()
    for src, dst in carries:
        handle = slots[dst][1]
        first = [(owners[dst], cur.after[owners[dst]])] if dst in owners else []
        for k, (c, key, kind, desc) in first + list(cur.after.items()):
            nd = desc[4][1] if desc[0] == "T" else None
            if nd is not None and nd.buffer[0] is handle and nd.is_compact():
                before = cur.before.get(k)
                renew = before is None or before[3][0] != "T" or before[3][4][0] is not desc[4][0]
                slots[dst] = ("carry", None, (c, key, kind, handle.size, nd.device, renew))
                slots[src] = ("fresh", handle.size, nd.device)
                owned.add(k)
                loose.add(id(nd))
                break
    return owned, loose


def _guards(cur: Trace, found: Dict[tuple, Any], owned: set, loose: set) -> Tuple[list, list]:
    """(guard, grads) of the program: every entry but the counters and the owned state is
    compared with its value after ``cur`` (a Tensor over owned state by identity only); a
    ``grad`` must be None, or not, as before ``cur``, and is re-bound to its value after
    ``cur`` by each replay (unless owned)."""
    guard, grads = [], []
    for k, (c, key, kind, desc) in cur.after.items():
        if kind == "grad":
            before = cur.before.get(k)
            if before is None:
                raise CaptureError("a Tensor's .grad could not be read before the call")
            rebind = k not in owned and (before[3][0] != "=" or desc[0] != "=")
            value = desc[4][0] if desc[0] == "T" else desc[1]
            grads.append((c, guards.form(before[3]), value, rebind))
        elif k not in found and k not in owned:
            guard.append((c, key, kind, guards.expect(desc, loose)))
    return guard, grads


def owned_entries(p: Program) -> List[Tuple[int, tuple]]:
    """(slot, (container, key, kind, size, device, renew)) of the carried state read from its
    owner: ``renew`` when the traced call gave the entry a new Tensor (batch norm's running
    averages), else the entry's Tensor gets the new array (a parameter)."""
    return [(s, d[2]) for s, d in enumerate(p.slots) if d[0] == "carry" and d[1] is None]


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


# ---- baking -------------------------------------------------------------------------------------
def bake(p: Program) -> None:
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
        elif d[0] == "fresh":
            bufs.append(None)  # allocated by each replay
        else:
            bufs.append(d[1])  # None for state looked up at each replay
    input_slots = {s for s, _ in inputs} | {s for s, _ in owned_entries(p)}
    input_slots |= {s for s, d in enumerate(p.slots) if d[0] == "fresh"}
    kinds = [op[0] for op in p.ops]
    p.draws_before_read = "rand" in kinds and "read" in kinds[kinds.index("rand") :]
    p.baked = [[_bake_op(p, i, op, bufs, input_slots) for i, op in enumerate(p.ops)], bufs, inputs]


def _bake_op(p: Program, i: int, op: tuple, bufs: List[Any], input_slots: set) -> tuple:
    if op[0] == "rand":
        _, dev, kind, shape, s = op
        draw = np.random.rand if kind == "rand" else np.random.randn

        def fresh(out: Any, dev: Any = dev, shape: tuple = shape, draw: Any = draw) -> None:
            dev.from_numpy(np.asarray(draw(*shape).astype("float32"), order="C"), out)

        return (0, fresh, (bufs[s],), [(0, 0, s)] if s in input_slots else [])
    desc = op[4] if op[0] == "call" else op[3]
    args = [bufs[a[1]] if a[0] == "slot" else a[1] for a in desc]
    patch = [(n, 0, a[1]) for n, a in enumerate(desc) if a[0] == "slot" and a[1] in input_slots]
    patch += [(pos, 1, n) for op_i, pos, n in p.counter_uses if op_i == i]
    if op[0] == "read":
        return (1, op[2], tuple(args) + (op[4],), patch)
    return (0, op[3], tuple(args), patch)
