"""What a replay must find unchanged: the Python state a step reads, and its arguments.

An *entry* ``(container, key, kind)`` names one value the step can read: ``"attr"`` an
attribute, ``"item"`` a dict item (a global), ``"keys"`` the class and attribute names of an
object (an attribute assigned after capture, such as ``module.forward = ...``, or a module
class's ``forward`` replaced), ``"grad"`` a Tensor's ``grad`` (re-bound by each replay).
A *description* of a value is a tuple whose first item is its tag; :func:`strip` drops the
objects it keeps alive, :func:`form` what a step may change between calls.
"""

from __future__ import annotations

import hashlib
import types
import weakref
from typing import Any, Callable, Container, Dict, Iterable, List, Optional, Tuple

import numpy as np

from .. import autograd
from ..autograd import Tensor

Entry = Tuple[Any, Any, str]

# Simple Python values whose equality the guard checks.
SCALARS = (bool, int, float, str, type(None), np.integer, np.floating, np.bool_)
# Number of leading items of a description compared (the rest keeps objects alive).
_COMPARED = {"T": 4, "A": 3, "N": 3, "K": 2, "is": 2}


class CaptureError(Exception):
    """Internal: why a traced call cannot become a program (the step then stays eager)."""


class Layout:
    """What a ``"keys"`` entry reads: an object's class, its attribute names and, for a
    module, its class's ``forward`` and ``__call__``."""

    def __init__(self, obj: Any) -> None:
        cls = type(obj)
        methods = tuple(_class_attribute(cls, n) for n in ("forward", "__call__"))
        names = tuple(vars(obj)) if not _slot_names(cls) else tuple(attributes(obj))
        self.key = (id(cls), names, tuple(id(m) for m in methods))
        self.objects = (cls, methods)


class Content:
    """A numpy array's contents, shape and dtype, compared by value: a copy when ``copy`` (a
    digest of the bytes for an array over 8 MiB, to bound the memory of the snapshots)."""

    LIMIT = 8 << 20

    def __init__(self, array: np.ndarray, copy: bool = True) -> None:
        self.dtype, self.shape = array.dtype, array.shape
        self.array: Optional[np.ndarray] = array
        self.digest: Optional[bytes] = None
        if copy and array.nbytes > self.LIMIT and array.dtype != object:
            self.array, self.digest = None, _digest(array)
        elif copy:
            self.array = np.array(array)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Content):
            return NotImplemented
        if self.dtype != other.dtype or self.shape != other.shape:
            return False
        a, b = self.array, other.array
        if a is not None and b is not None:
            return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        return self._digest() == other._digest()

    def _digest(self) -> bytes:
        if self.array is not None:
            return _digest(self.array)
        assert self.digest is not None
        return self.digest

    __hash__ = None  # type: ignore[assignment]


def _digest(array: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=16).digest()


def _class_attribute(cls: type, name: str) -> Any:
    """``name`` as the class (or a base) defines it, with no binding (None if undefined)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def read(container: Any, key: Any, kind: str) -> Any:
    """The value an entry names now (AttributeError/KeyError when it is gone)."""
    if kind == "item":
        return container[key]
    if kind == "keys":
        return Layout(container)
    return getattr(container, key)


def name(container: Any, key: Any, kind: str) -> str:
    """How a reason names an entry."""
    if kind == "keys":
        return f"the attributes of a {type(container).__name__}"
    if kind == "grad":
        return "a parameter's .grad"
    if kind == "item":
        return repr(key)
    return f"{type(container).__name__}.{key}"


def is_counter(container: Any, key: Any, kind: str) -> bool:
    """The ints a replay may advance by one per call: an optimizer's step count ``t`` (Adam's
    bias correction). Any other int that a step changes is state a replay cannot repeat (a
    branch on it would be frozen)."""
    from ..optim import Optimizer

    return kind == "attr" and key == "t" and isinstance(container, Optimizer)


# ---- the state a step can read ------------------------------------------------------------------
class _Walk:
    """Collects the entries of everything a step names (see :func:`state_objects`)."""

    def __init__(self) -> None:
        self.entries: List[Entry] = []
        self.seen: set = set()

    def visit(self, obj: Any, depth: int) -> None:
        if id(obj) in self.seen or depth > 8:
            return
        if isinstance(obj, Tensor):
            self.seen.add(id(obj))
            self.entries.append((obj, "grad", "grad"))
        elif isinstance(obj, types.FunctionType):
            self.seen.add(id(obj))
            self.function(obj, depth + 1)
        elif isinstance(obj, types.MethodType):
            self.visit(obj.__self__, depth + 1)
            self.visit(obj.__func__, depth + 1)
        elif _has_state(obj):
            self.seen.add(id(obj))
            self.entries.append((obj, "", "keys"))
            for key, value in attributes(obj).items():
                self.entries.append((obj, key, "attr"))
                self.value(value, depth + 1)

    def value(self, value: Any, depth: int) -> None:
        if isinstance(value, (list, tuple)):
            for v in value:
                self.visit(v, depth)
        elif isinstance(value, dict):
            for v in list(value.values()):
                self.visit(v, depth)
        else:
            self.visit(value, depth)

    def function(self, f: types.FunctionType, depth: int) -> None:
        for cell in f.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.entries.append((cell, "cell_contents", "attr"))
            self.value(value, depth)
        g = f.__globals__
        for n in sorted(_names(f.__code__)):
            if n in g and not isinstance(g[n], types.ModuleType):
                self.entries.append((g, n, "item"))
                self.value(g[n], depth)
        for d in f.__defaults__ or ():
            self.value(d, depth)


def _has_state(obj: Any) -> bool:
    """An object whose attributes are guarded: a module, an optimizer, a config or scheduler
    object... anything with a ``__dict__`` or with ``__slots__`` declared in Python, except
    classes, Python modules and arrays."""
    from ..backend_ndarray import NDArray

    if isinstance(obj, (type, types.ModuleType, NDArray, np.ndarray)):
        return False
    return hasattr(obj, "__dict__") or bool(_slot_names(type(obj)))


_SLOTS: "weakref.WeakKeyDictionary[type, Tuple[str, ...]]" = weakref.WeakKeyDictionary()


def _slot_names(cls: type) -> Tuple[str, ...]:
    """The attribute names declared by ``__slots__`` in the Python classes of ``cls``'s MRO
    (looked up once per class: a class's slots cannot change)."""
    names = _SLOTS.get(cls)
    if names is not None:
        return names
    found: List[str] = []
    for klass in cls.__mro__:
        declared = vars(klass).get("__slots__", ())
        for n in (declared,) if isinstance(declared, str) else declared:
            if n.startswith("__") and not n.endswith("__"):
                n = f"_{klass.__name__.lstrip('_')}{n}"  # a private name, as Python mangles it
            if n not in ("__dict__", "__weakref__") and n not in found:
                found.append(n)
    names = _SLOTS[cls] = tuple(found)
    return names


def attributes(obj: Any) -> Dict[str, Any]:
    """An object's attributes: its ``__dict__`` and its set ``__slots__``, by name."""
    found = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    for n in _slot_names(type(obj)):
        try:
            found[n] = getattr(obj, n)
        except AttributeError:  # a slot never set
            continue
    return found


def _names(code: types.CodeType) -> set:
    found = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            found |= _names(c)
    return found


def state_objects(fn: Callable, extra: Iterable[Any]) -> List[Entry]:
    """The entries naming what ``fn`` can read: closure cells, the globals its code names, a
    bound method's object, plus ``extra``; every object found there with a ``__dict__``
    (modules, optimizers, plain config or scheduler objects) is expanded into its attributes,
    recursively, and every Tensor into its ``grad``."""
    walk = _Walk()
    walk.visit(fn, 0)
    for obj in extra:
        walk.value(obj, 0)
    return walk.entries


# ---- descriptions -------------------------------------------------------------------------------
def describe(value: Any, copy: bool = True) -> Any:
    """What the guard compares for one state value: the value for numbers and strings, the
    contents of a numpy array, the identity (and array, and ``requires_grad``) of a Tensor, the
    identity of an NDArray and its buffer, a summary for containers; other objects by
    identity. ``copy=False``: numpy arrays are not copied (a description compared at once)."""
    from ..backend_ndarray import NDArray

    if isinstance(value, SCALARS):
        return ("=", value)
    if isinstance(value, Tensor):
        data = value.cached_data
        return ("T", id(value), id(data), bool(value.requires_grad), (value, data))
    if isinstance(value, NDArray):
        return ("A", id(value), id(value.buffer[0]), value)
    if isinstance(value, np.ndarray):
        return ("N", id(value), Content(value, copy), value)
    if isinstance(value, Layout):
        return ("K", value.key, value.objects)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(describe(v, copy) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, describe(v, copy)) for k, v in list(value.items())))
    return ("is", id(value), value)


def strip(desc: Any) -> Any:
    """A description without the objects it keeps alive (for comparisons)."""
    n = _COMPARED.get(desc[0])
    if n is not None:
        return desc[:n]
    if desc[0] in ("list", "tuple"):
        return (desc[0], tuple(strip(d) for d in desc[1]))
    if desc[0] == "dict":
        return ("dict", tuple((k, strip(d)) for k, d in desc[1]))
    return desc


def form(desc: Any) -> Any:
    """A description with object identities dropped: what a step may not change in Python
    (numbers, flags, numpy contents, attribute names, container lengths, ``requires_grad``),
    since a replay runs no Python. Rebinding a Tensor is fine: the buffers behind it are
    written by the replay (kept or carried slots)."""
    tag = desc[0]
    if tag in ("A", "is"):
        return tag
    if tag == "T":
        return (tag, desc[3])
    if tag in ("N", "K"):
        return (tag, desc[2] if tag == "N" else desc[1])
    if tag in ("list", "tuple"):
        return (tag, tuple(form(d) for d in desc[1]))
    if tag == "dict":
        return ("dict", tuple((k, form(d)) for k, d in desc[1]))
    return desc


def snapshot(entries: List[Entry]) -> Dict[tuple, Any]:
    """(container, key, kind, description) of every entry's value now, by (id, key, kind)
    (entries that vanished are left out)."""
    out = {}
    for container, key, kind in entries:
        try:
            value = read(container, key, kind)
        except (AttributeError, KeyError):
            continue
        out[(id(container), key, kind)] = (container, key, kind, describe(value))
    return out


def expect(desc: Any, loose: Container[int] = ()) -> tuple:
    """What :func:`check` compares a guarded value with, from its description after the traced
    call: (0, type, value) for a number or string, (1, tensor, array, requires_grad) for a
    Tensor (array None when the id of its array is in ``loose``: carried state, which a replay
    finds through its owner), (2, object) for an identity, (4, type name, items) for a list or
    tuple, (5, keys, items) for a dict, (3, stripped description) for the rest."""
    tag = desc[0]
    if tag == "=":
        return (0, type(desc[1]), desc[1])
    if tag == "T":
        data = desc[4][1]
        return (1, desc[4][0], None if id(data) in loose else data, desc[3])
    if tag == "is":
        return (2, desc[2])
    if tag in ("list", "tuple"):
        return (4, tag, tuple(expect(d, loose) for d in desc[1]))
    if tag == "dict":
        return (5, tuple(k for k, _ in desc[1]), tuple(expect(d, loose) for _, d in desc[1]))
    return (3, strip(desc))


def _matches(value: Any, e: tuple) -> bool:
    code = e[0]
    if code == 2:
        return value is e[1]
    if code == 1:
        return (
            value is e[1]
            and (e[2] is None or value.cached_data is e[2])
            and value.requires_grad == e[3]
        )
    if code == 0:
        return type(value) is e[1] and (value == e[2] or (value != value and e[2] != e[2]))
    if code == 4:
        return (
            type(value).__name__ == e[1]
            and len(value) == len(e[2])
            and all(_matches(v, x) for v, x in zip(value, e[2]))
        )
    if code == 5:
        return (
            type(value) is dict
            and tuple(value) == e[1]
            and all(_matches(v, x) for v, x in zip(value.values(), e[2]))
        )
    return bool(strip(describe(value, copy=False)) == e[1])


def check(guard: List[tuple], grads: List[tuple]) -> Optional[str]:
    """None when every guarded value is as the program expects, else the reason: ``guard``
    holds (container, key, kind, :func:`expect`), ``grads`` (tensor, form of its ``grad``
    before the traced call, ...)."""
    for c, key, kind, e in guard:
        try:
            value = getattr(c, key) if kind == "attr" else read(c, key, kind)
        except (AttributeError, KeyError):
            return f"{name(c, key, kind)} is gone"
        if not _matches(value, e):
            return f"{name(c, key, kind)} changed"
    for t, expected, *_ in grads:
        if form(describe(t.grad, copy=False)) != expected:
            return "a parameter's .grad is None where the traced call had one, or the reverse"
    return None


# ---- the arguments ------------------------------------------------------------------------------
def signature(args: tuple, kwargs: dict) -> Tuple[tuple, List[Any]]:
    """(hashable signature, input buffers) of one call's arguments."""
    sig: List[Any] = [autograd.is_grad_enabled()]
    handles: List[Any] = []
    for a in args:
        sig.append(_argument(a, handles))
    for k in sorted(kwargs):
        sig.append((k, _argument(kwargs[k], handles)))
    return tuple(sig), handles


def _argument(a: Any, handles: List[Any]) -> Any:
    from ..backend_ndarray import NDArray

    if isinstance(a, Tensor):
        data = a.realize_cached_data()
        if not isinstance(data, NDArray):
            raise CaptureError(f"input of type {type(data).__name__} is not an NDArray")
        handle, offset = data.buffer
        if any(h is handle for h in handles):
            raise CaptureError("two inputs share one buffer")
        handles.append(handle)
        return ("T", data.shape, data.strides, offset, handle.size, data.device.name, a.dtype,
                a.requires_grad)  # fmt: skip
    if isinstance(a, SCALARS):
        return ("=", type(a).__name__, a)
    if isinstance(a, (tuple, list)):
        return (type(a).__name__, tuple(_argument(x, handles) for x in a))
    raise CaptureError(
        f"argument of type {type(a).__name__} cannot be guarded (pass Tensors and numbers)"
    )


# ---- counters -----------------------------------------------------------------------------------
def counters(prev: Any, cur: Any) -> Dict[tuple, Entry]:
    """The counters (:func:`is_counter`) of the guarded state that grew by exactly one in each
    of the two traced calls."""
    found = {}
    for k, (c, key, kind, e1) in cur.after.items():
        if not is_counter(c, key, kind):
            continue
        descs = [t.get(k) for t in (prev.before, prev.after, cur.before)]
        if any(d is None for d in descs):
            continue
        d0, d1, e0 = (d[3] for d in descs if d is not None)
        if all(d[0] == "=" and type(d[1]) is int for d in (d0, d1, e0, e1)):
            if d1[1] - d0[1] == 1 and e1[1] - e0[1] == 1 and e0 == d1:
                found[k] = (c, key, kind)
    return found


def counter_for(found: Dict[tuple, Entry], prev: Any, cur: Any, x: Any, y: Any) -> Optional[int]:
    """The index of the counter whose values after the two calls were ``x`` and ``y``."""
    if type(x) is not int or type(y) is not int:
        return None
    for n, k in enumerate(found):
        if prev.after[k][3][1] == x and cur.after[k][3][1] == y:
            return n
    return None


def same(x: Any, y: Any) -> bool:
    """Equal values of the same type (NaN equals NaN)."""
    if type(x) is not type(y):
        return False
    if isinstance(x, float) and x != x:
        return y != y
    return bool(x == y)
