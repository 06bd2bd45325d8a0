"""One traced call of a step: the device calls it made, with buffers named by their role.

The calls come through the device layer's public hook (``device.recording``); buffers are
followed by identity (an NDArray's ``buffer`` handle), never by patching a device.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from ..backend_ndarray import fused_spec, protocol

# Buffer arguments each kernel writes (unknown kernels: every buffer argument counts as written):
# the protocol's array functions and the course's compact entry points write their ``out``;
# each fused kernel its declared outputs and the inputs it updates in place (fused_spec, where
# the kernels are specified).
WRITES: Dict[str, Tuple[str, ...]] = {
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
    **dict.fromkeys(protocol.COURSE_PARAMS, ("out",)),
    **{
        k.name: tuple(o.name for o in k.outputs) + k.updates
        for k in fused_spec.KERNELS.values()
        if k.name is not None
    },
}


@dataclass
class Trace:
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
        """The key of a buffer handle (a first sighting of an unknown one is external)."""
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
        """Register a buffer allocated during the call; returns its temporary index."""
        self.tmp.append(handle)
        k = len(self.tmp) - 1
        self.ids[id(handle)] = ("tmp", k)
        return k


class TraceRecorder:
    """The recorder given to ``device.recording``: appends each reported call to a Trace."""

    def __init__(self, trace: Trace) -> None:
        from ..backend_ndarray.device import all_devices

        self.trace = trace
        types_ = (d.mod.Array for d in all_devices() if d.mod is not None)
        self.array_types = tuple(t for t in types_ if isinstance(t, type))

    def record(self, device: Any, name: str, args: tuple, result: Any) -> None:
        """One device call, reported after it returned."""
        trace = self.trace
        if name in ("rand", "randn"):
            k = trace.new_tmp(result.buffer[0])
            trace.ops.append(("rand", device, name, args, k))
        elif name == "Array":
            trace.ops.append(("alloc", trace.new_tmp(result), device, int(args[0])))
        elif name == "to_numpy":
            trace.ops.append(("read", device, self._encode(args), np.array(result)))
        else:
            trace.ops.append(("call", device, name, self._encode(args)))

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


def written(op: tuple) -> List[int]:
    """The slots a ("call", dev, name, fn, args) op writes."""
    _, _dev, name, _fn, args = op
    names = WRITES.get(name)
    if names is None:
        return [a[1] for a in args if a[0] == "slot"]
    params = param_names(name)
    return [a[1] for p, a in zip(params, args) if a[0] == "slot" and p in names]


# The course's entry points are declared by name in the protocol (their operands are compact).
_PARAMS: Dict[str, List[str]] = {n: list(p) for n, p in protocol.COURSE_PARAMS.items()}


def param_names(name: str) -> List[str]:
    """The parameter names of the protocol's device function ``name``."""
    names = _PARAMS.get(name)
    if names is None:
        names = list(inspect.signature(getattr(protocol.DeviceModule, name)).parameters)[1:]
        _PARAMS[name] = names
    return names
