"""Core data structures: the computational graph and reverse-mode automatic differentiation.

A :class:`Value` is a node of the graph: the :class:`Op` that produced it, its ``inputs`` and
the array it holds (``cached_data``). A :class:`Tensor` holds one array, a
:class:`TensorTuple` a tuple of arrays. Ops compute on raw arrays (``compute``) and give their
vector-Jacobian product with needle ops (``gradient``), so a gradient is itself a differentiable
graph and second derivatives work.
"""

from __future__ import annotations

import sys
import types
from functools import reduce
from operator import add
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    FrozenSet,
    Generic,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

import numpy

import needle

# NDArray and array_api are re-exported: the course's ops import them from here.
from .backend_selection import Device, default_tensor_device
from .backend_selection import NDArray as NDArray
from .backend_selection import array_api as array_api

# Grad mode (per thread) lives in its own module, re-exported here; every op reads _grad_mode.
from .grad_mode import MODES_CHANGED as _MODES_CHANGED
from .grad_mode import _grad_mode as _grad_mode
from .grad_mode import enable_grad as enable_grad
from .grad_mode import is_grad_enabled as is_grad_enabled
from .grad_mode import no_grad as no_grad
from .grad_mode import set_grad_enabled as set_grad_enabled

if TYPE_CHECKING:
    from typing_extensions import Self

# The node type an op produces (Tensor or TensorTuple): its gradient receives adjoints of it.
V = TypeVar("V", bound="Value")
# What ``gradient`` returns: one adjoint, or one per input (None for an input that needs none).
Adjoints = Union["Value", Tuple[Optional["Value"], ...], List[Optional["Value"]]]

# ``autograd.LAZY_MODE`` (the course's switch; see _AutogradModule at the end): when True, ops
# build the graph without computing and ``realize_cached_data()`` computes. Held per thread.
if TYPE_CHECKING:
    LAZY_MODE: bool
# Number of live Values: +1 when a Value is initialised, -1 in ``Value.__del__`` (a Value whose
# construction failed is never counted).
TENSOR_COUNTER = 0


class Op(Generic[V]):
    """An operator: ``compute`` works on raw arrays, ``gradient`` is its vector-Jacobian product.

    ``V`` is the node type it makes (``Tensor`` for a TensorOp, ``TensorTuple`` for a
    TensorTupleOp). Each op declares its own ``__call__`` and ``compute`` arguments, so the base
    signatures take anything.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> V:
        raise NotImplementedError()

    def compute(self, *args: Any, **kwargs: Any) -> Any:
        """Forward pass on raw arrays (the backend's NDArray): returns the output array(s)."""
        raise NotImplementedError()

    def gradient(self, out_grad: V, node: V) -> Adjoints:
        """The adjoint of each input given ``out_grad``, the adjoint of ``node`` (this op's output).

        Written with needle ops, so the returned gradients are differentiable themselves.
        """
        raise NotImplementedError()

    # Set by ops that pick component ``self.index`` of a TensorTuple (``tuple_get_item``): the
    # backward pass then routes the adjoint to that component directly instead of building a
    # mostly-zero tuple per pick (O(len²) work when every component of a split is picked).
    selects_component = False
    index: int  # the component such an op picks

    # False for ops whose gradient reads only their inputs and saved state, never the node's own
    # array (a product, a sum): the opt-in fast backward then frees that array before computing the
    # node's gradient when nothing but the pass holds the node.
    gradient_reads_output = True

    def gradient_as_tuple(self, out_grad: V, node: V) -> Tuple[Optional["Value"], ...]:
        """``gradient`` always returned as a tuple (one entry per input)."""
        output = self.gradient(out_grad, node)
        if isinstance(output, tuple):
            return output
        if isinstance(output, list):
            return tuple(output)
        return (output,)


class TensorOp(Op["Tensor"]):
    """An op whose output is a Tensor."""

    def __call__(self, *args: Any) -> "Tensor":
        return Tensor.make_from_op(self, args)


class TensorTupleOp(Op["TensorTuple"]):
    """An op whose output is a TensorTuple."""

    def __call__(self, *args: Any) -> "TensorTuple":
        return TensorTuple.make_from_op(self, args)


class Value:
    """A node of the computational graph."""

    # The fields every node sets live in slots (cheaper to make, set and free than a dict
    # entry each); anything else, such as ``grad`` once set, goes to the instance __dict__.
    __slots__ = ("op", "inputs", "cached_data", "requires_grad", "__dict__", "__weakref__")
    op: Optional[Op[Any]]
    inputs: Sequence["Value"]
    # The node's array(s): an NDArray for a Tensor, a tuple of them for a TensorTuple; None until
    # computed (LAZY_MODE). Tensor and TensorTuple narrow the type.
    cached_data: Any
    requires_grad: bool
    # Class defaults, so that making a node does not have to set them.
    grad: Optional["Value"] = None
    num_outputs = 1
    _retains_grad = False
    # Set on the all-zero adjoints of zero_adjoints() (see is_zero_adjoint).
    _zero_adjoint = False

    if TYPE_CHECKING:  # every node type (Tensor, TensorTuple) has one

        def detach(self) -> "Value": ...

    def realize_cached_data(self) -> Any:
        """The node's array, computed from its inputs on first use and cached."""
        if self.cached_data is not None:
            return self.cached_data
        assert self.op is not None, "a leaf always holds its array"
        self.cached_data = self.op.compute(*[x.realize_cached_data() for x in self.inputs])
        return self.cached_data

    def is_leaf(self) -> bool:
        """True for a node made by no op (a constant or a variable)."""
        return self.op is None

    def replace_array(self, array: NDArray) -> None:
        """Make ``array`` this node's value (no graph is recorded; nothing is checked).

        The one place where a node's array is swapped after creation: the ``data`` setter (after
        its checks) and the optimizers (to give a parameter a compact buffer) go through here.
        """
        self.cached_data = array

    def retain_grad(self) -> None:
        """Keep this interior node's adjoint in ``.grad`` after ``backward()`` (as in PyTorch).

        Leaves always keep theirs; other interior adjoints are released as reverse mode moves on.
        """
        self._retains_grad = True

    def __del__(self) -> None:
        global TENSOR_COUNTER
        if hasattr(self, "op"):  # only initialised Values were counted (op is set last)
            TENSOR_COUNTER -= 1

    def _init(
        self,
        op: Optional[Op[Any]],
        inputs: Sequence["Value"],
        *,
        num_outputs: int = 1,
        cached_data: Any = None,
        requires_grad: Optional[bool] = None,
    ) -> None:
        global TENSOR_COUNTER
        if requires_grad is None:
            requires_grad = _grad_mode.enabled and any(x.requires_grad for x in inputs)
        self.inputs = inputs
        if num_outputs != 1:
            self.num_outputs = num_outputs
        self.cached_data = cached_data
        self.requires_grad = requires_grad
        self.grad = None
        TENSOR_COUNTER += 1
        self.op = op  # set last: marks the Value as counted

    @classmethod
    def make_const(cls, data: Any, *, requires_grad: bool = False) -> Self:
        """A leaf holding ``data`` (an array), with no history."""
        return _make_leaf(cls, data, requires_grad)

    @classmethod
    def make_from_op(cls, op: Op[Any], inputs: Sequence["Value"]) -> Self:
        """The node ``op(*inputs)``: computed now unless LAZY_MODE; detached when no grad is needed.

        The hot path of every op, hence written out by hand rather than through ``_init``.
        """
        global TENSOR_COUNTER
        value = object.__new__(cls)
        if _MODES_CHANGED:  # some thread left the default modes: read this thread's
            requires_grad = _grad_mode._enabled and any(x.requires_grad for x in inputs)
            if _grad_mode._lazy:
                value.requires_grad = requires_grad
                value.cached_data = None
                value.inputs = inputs
                TENSOR_COUNTER += 1
                value.op = op
                return value
        else:  # recording and eager, as every thread is by default
            requires_grad = False
            for x in inputs:
                if x.requires_grad:
                    requires_grad = True
                    break
        value.requires_grad = requires_grad
        if len(inputs) == 2:
            x, y = inputs
            data, other = x.cached_data, y.cached_data
            value.cached_data = op.compute(
                x.realize_cached_data() if data is None else data,
                y.realize_cached_data() if other is None else other,
            )
        elif len(inputs) == 1:
            x = inputs[0]
            data = x.cached_data
            value.cached_data = op.compute(x.realize_cached_data() if data is None else data)
        else:
            value.cached_data = op.compute(*[x.realize_cached_data() for x in inputs])
        TENSOR_COUNTER += 1
        if requires_grad:
            value.inputs = inputs
            value.op = op
        else:
            value.inputs = []
            value.op = None
        return value


def _make_leaf(cls: type[V], data: Any, requires_grad: bool) -> V:
    """``cls.make_const(data)``'s node, written out (no ``_init`` keywords, no ``super()``):
    every backward pass makes one for its ones out_grad."""
    global TENSOR_COUNTER
    value = object.__new__(cls)
    value.inputs = []
    value.cached_data = data
    value.requires_grad = requires_grad
    TENSOR_COUNTER += 1
    value.op = None  # set last, as in _init
    return value


class TensorTuple(Value):
    """A tuple of tensors (not nested): the output of a TensorTupleOp such as ``split``."""

    cached_data: Optional[Tuple[NDArray, ...]]
    # The components known to be all zero: reverse mode sets it on the adjoint tuples it
    # assembles from the components that were picked (an op's gradient may skip their terms).
    zero_components: FrozenSet[int] = frozenset()

    if TYPE_CHECKING:  # the inherited method, with this node type's array

        def realize_cached_data(self) -> Tuple[NDArray, ...]: ...

    def __len__(self) -> int:
        return len(self.realize_cached_data())

    def __getitem__(self, index: int) -> "Tensor":
        n = len(self)
        if not isinstance(index, (int, numpy.integer)) or not -n <= index < n:
            raise IndexError(f"TensorTuple index {index!r} is out of range for length {n}")
        if not self.requires_grad and not _grad_mode.lazy:
            # what tuple_get_item would make of a tuple without history (a constant), made
            # directly: reverse mode without create_graph picks three of these per norm layer
            return Tensor.make_const(self.realize_cached_data()[int(index) % n])
        return needle.ops.tuple_get_item(self, int(index) % n)

    def __iter__(self) -> Iterator["Tensor"]:
        return (self[i] for i in range(len(self)))

    def tuple(self) -> Tuple["Tensor", ...]:
        """The components as a Python tuple of Tensors."""
        return tuple(x for x in self)

    def __repr__(self) -> str:
        return "needle.TensorTuple" + str(self.tuple())

    def __str__(self) -> str:
        return self.__repr__()

    def __add__(self, other: "TensorTuple") -> "TensorTuple":
        """Component-wise sum of two tuples of the same length."""
        if not isinstance(other, TensorTuple):
            raise TypeError(
                f"can only add a TensorTuple to a TensorTuple, got {type(other).__name__}"
            )
        if len(self) != len(other):
            raise ValueError(f"cannot add TensorTuples of lengths {len(self)} and {len(other)}")
        parts = []
        for i in range(len(self)):
            a, b = self[i], other[i]
            # Adjoints routed through tuple_get_item are mostly zeros: adding them is exact
            # (x + 0 == x), so skip the arithmetic instead of doing it len(tuple)² times.
            parts.append(b if is_zero_adjoint(a) else a if is_zero_adjoint(b) else a + b)
        return needle.ops.make_tuple(*parts)

    def detach(self) -> "TensorTuple":
        """A TensorTuple sharing the arrays, with no history."""
        return TensorTuple.make_const(self.realize_cached_data())


def is_zero_adjoint(value: Value) -> bool:
    """True for the all-zero constant adjoints that ``tuple_get_item`` sends to the components
    it did not select (marked ``_zero_adjoint``)."""
    return value._zero_adjoint


def _full(shape: Iterable[int], value: float, dtype: Any, device: Device) -> NDArray:
    """A raw array of ``shape`` filled with ``value`` (the backend's array type)."""
    return device.full(tuple(shape), value, dtype=dtype)


def _squeezed(shape: Iterable[int]) -> Tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


class Tensor(Value):
    """An n-dimensional array with autograd.

    ``Tensor(array, *, device=None, dtype=None, requires_grad=True)`` makes a leaf holding
    ``array`` (a numpy array, nested list, NDArray or Tensor) on ``device`` (default:
    ``default_tensor_device()``, the compiled ``cpu()`` when it is built; an NDArray or Tensor
    stays on its own device). As in the course, a Tensor of the same device and dtype shares its
    array (nothing in needle writes a parameter's array in place: the optimizers give it a new
    one), anything else is copied. On the
    numpy backend ``dtype=None`` keeps numpy's
    dtype (as in the course); on the NDArray backend every array is float32. An unknown keyword
    argument is a TypeError naming it.
    """

    grad: Optional["Tensor"]
    cached_data: Optional[NDArray]
    # A Tensor's inputs are Tensors, except the TensorTuple input of tuple_get_item's output
    # (ops_tuple.TupleGetItem, the one op that reads it as a TensorTuple).
    inputs: Sequence["Tensor"]
    # numpy defers to Tensor's reflected operators: np.float32(2) * t is a Tensor, not an array
    __array_ufunc__ = None

    if TYPE_CHECKING:  # the inherited method, with this node type's array

        def realize_cached_data(self) -> NDArray: ...

    def __init__(
        self,
        array: Any,
        *,
        device: Optional[Device] = None,
        dtype: Any = None,
        requires_grad: bool = True,
    ):
        if isinstance(array, Tensor):
            if device is None:
                device = array.device
            if dtype is None:
                dtype = array.dtype
            if device == array.device and dtype == array.dtype:
                cached_data = array.realize_cached_data()
            else:  # copy through numpy
                cached_data = array_api.array(array.numpy(), device=device, dtype=dtype)
        else:
            if device is None:  # an NDArray stays where it is; anything else goes to the default
                device = array.device if isinstance(array, NDArray) else default_tensor_device()
            cached_data = array_api.array(array, device=device, dtype=dtype)
        self._init(None, [], cached_data=cached_data, requires_grad=requires_grad)

    @classmethod
    def make_const(cls, data: Any, requires_grad: bool = False) -> Self:
        """A leaf tensor holding ``data`` (an array, or the array of a Tensor), sharing it."""
        if isinstance(data, Tensor):
            data = data.realize_cached_data()
        return _make_leaf(cls, data, requires_grad)

    @property
    def data(self) -> "Tensor":
        """A detached tensor sharing this tensor's array (no history, requires_grad=False)."""
        return self.detach()

    @data.setter
    def data(self, value: "Tensor") -> None:
        """Replace this tensor's array with ``value``'s (no graph is recorded).

        ``value`` must have the same dtype and device, and the same shape or one differing only
        by size-1 dimensions (e.g. (n,) into a (1, n) bias), which is reshaped to this shape.
        """
        if not isinstance(value, Tensor):
            raise TypeError(f"Tensor.data must be set to a Tensor, got {type(value).__name__}")
        if value.dtype != self.dtype:
            raise TypeError(
                f"cannot assign data of dtype {value.dtype} to a tensor of dtype {self.dtype}"
            )
        if value.device != self.device:
            raise ValueError(
                f"cannot assign data on device {value.device} to a tensor on device {self.device}"
            )
        array = value.realize_cached_data()
        if tuple(value.shape) != tuple(self.shape):
            if _squeezed(value.shape) != _squeezed(self.shape):
                raise ValueError(
                    f"cannot assign data of shape {tuple(value.shape)} to a tensor of "
                    f"shape {tuple(self.shape)}"
                )
            array = array.compact().reshape(tuple(self.shape))
        self.replace_array(array)

    def detach(self) -> "Tensor":
        """A new leaf tensor sharing the array, cut from the graph."""
        return Tensor.make_const(self.realize_cached_data())

    @property
    def shape(self) -> Tuple[int, ...]:
        data = self.cached_data  # the realized array, without a call when it is there
        return (self.realize_cached_data() if data is None else data).shape

    @property
    def dtype(self) -> Any:
        data = self.cached_data  # the realized array, without a call when it is there
        return (self.realize_cached_data() if data is None else data).dtype

    @property
    def device(self) -> Device:
        data = self.cached_data  # the realized array, without a call when it is there
        return (self.realize_cached_data() if data is None else data).device

    def backward(self, out_grad: Optional["Tensor"] = None, *, create_graph: bool = True) -> None:
        """Reverse mode from this tensor: sets ``.grad`` on every leaf it depends on.

        ``out_grad`` (same shape and device as self) defaults to ones. As in the course, the
        backward pass extends the graph: each ``.grad`` is a needle expression of the forward
        nodes, so it can be differentiated again (``x.grad.backward()``). A leaf's gradient
        graph refers back to the leaf (a reference cycle, as with PyTorch's
        ``create_graph=True``); it is released when the gradient is reset or overwritten
        (``opt.reset_grad()``, the next ``backward()``, ``x.grad = None``). Interior nodes keep
        their adjoint only after ``retain_grad()``.

        ``create_graph=False`` (an extension, PyTorch's default) records no graph: the
        gradients are constants, every interior adjoint is freed as soon as it has been passed
        on, and so is the forward graph, node by node, as the pass goes (PyTorch's
        ``retain_graph=False``): the tensors you hold keep their values, but a second backward
        through this graph raises RuntimeError. Inside ``no_grad()`` the pass records no graph
        either.
        """
        compute_gradient_of_variables(
            self, self.checked_out_grad(out_grad), create_graph=create_graph
        )

    def checked_out_grad(self, out_grad: Optional["Tensor"]) -> "Tensor":
        """``out_grad`` for a backward from this tensor (ones when None), after checking that it
        is a Tensor of this tensor's shape and device."""
        if out_grad is None:
            data = self.realize_cached_data()
            return Tensor.make_const(_full(data.shape, 1.0, data.dtype, data.device))
        if not isinstance(out_grad, Tensor):
            raise TypeError(f"backward's out_grad must be a Tensor, got {type(out_grad).__name__}")
        if tuple(out_grad.shape) != tuple(self.shape):
            raise ValueError(
                f"backward's out_grad has shape {tuple(out_grad.shape)}, expected "
                f"{tuple(self.shape)}"
            )
        if out_grad.device != self.device:
            raise ValueError(
                f"backward's out_grad is on {out_grad.device}, the tensor on {self.device}"
            )
        return out_grad

    def __repr__(self) -> str:
        return "needle.Tensor(" + str(self.realize_cached_data()) + ")"

    def __str__(self) -> str:
        return self.realize_cached_data().__str__()

    def numpy(self) -> numpy.ndarray:
        """A numpy copy of the array."""
        return self.realize_cached_data().numpy()

    # ---- operators: a Tensor operand gives the element-wise op (numpy broadcasting), a
    # scalar (number, numpy scalar, one-element array) the scalar op ----------------------------
    def __add__(self, other: Any) -> "Tensor":
        if isinstance(other, Tensor):
            return needle.ops.EWiseAdd()(self, other)
        return needle.ops.AddScalar(other)(self)

    def __mul__(self, other: Any) -> "Tensor":
        if isinstance(other, Tensor):
            return needle.ops.EWiseMul()(self, other)
        return needle.ops.MulScalar(other)(self)

    def __pow__(self, other: Any) -> "Tensor":
        if isinstance(other, Tensor):
            return needle.ops.EWisePow()(self, other)
        return needle.ops.PowerScalar(other)(self)

    def __sub__(self, other: Any) -> "Tensor":
        if isinstance(other, Tensor):
            return needle.ops.EWiseAdd()(self, needle.ops.Negate()(other))
        return needle.ops.AddScalar(-needle.ops.ops_mathematic.scalar_value(other, "subtract"))(
            self
        )

    def __rsub__(self, other: Any) -> "Tensor":
        """``other - self`` for a scalar ``other`` (an extension: the course has no __rsub__)."""
        op = needle.ops.AddScalar(other)
        return op(needle.ops.Negate()(self))

    def __truediv__(self, other: Any) -> "Tensor":
        if isinstance(other, Tensor):
            return needle.ops.EWiseDiv()(self, other)
        return needle.ops.DivScalar(other)(self)

    def __rtruediv__(self, other: Any) -> "Tensor":
        """``other / self`` for a scalar ``other`` (an extension)."""
        op = needle.ops.MulScalar(other)
        return op(needle.ops.PowerScalar(-1)(self))

    def __matmul__(self, other: Any) -> "Tensor":
        return needle.ops.MatMul()(self, other)

    def matmul(self, other: Any) -> "Tensor":
        return needle.ops.MatMul()(self, other)

    def sum(self, axes: Any = None) -> "Tensor":
        return needle.ops.Summation(axes)(self)

    def broadcast_to(self, shape: Sequence[int]) -> "Tensor":
        return needle.ops.BroadcastTo(shape)(self)

    def reshape(self, shape: Sequence[int]) -> "Tensor":
        return needle.ops.Reshape(shape)(self)

    def __neg__(self) -> "Tensor":
        return needle.ops.Negate()(self)

    def transpose(self, axes: Optional[Sequence[int]] = None) -> "Tensor":
        return needle.ops.Transpose(axes)(self)

    __radd__ = __add__
    __rmul__ = __mul__


# question: hw1_compute_gradient
def compute_gradient_of_variables(
    output_tensor: Value,
    out_grad: Value,
    *,
    create_graph: bool = True,
    before_gradient: Optional[Callable[[Value], None]] = None,
) -> None:
    """Reverse-mode AD: store in ``node.grad`` d(output·out_grad)/d(node) for the leaves.

    Walks ``reversed(find_topo_sort([output_tensor]))``; a node's adjoint is the sum of the
    contributions of every consumer (every path). Inputs that do not require grad get none.
    Leaves (and nodes that called ``retain_grad()``) keep their adjoint in ``.grad``; every other
    adjoint is dropped as soon as it has been passed on. The adjoints are computed with needle
    ops, recording their graph (differentiable gradients, the course's semantics) unless
    ``create_graph`` is False or this thread is in ``no_grad()``; then they are constants, and
    the pass frees the graph as it goes, as PyTorch's backward does: once a node has passed its
    adjoint on it is cut from its inputs (its op becomes a marker whose use raises
    RuntimeError), so each activation and saved array is freed as soon as the pass has used
    it, instead of living until the output is dropped. Tensors the caller holds keep their
    values; a second backward through the freed graph raises.

    ``before_gradient(node)``, when given, is called before each interior node's gradient is
    computed in a pass that records no graph (the opt-in fast backward frees arrays there).
    """
    record = create_graph and _grad_mode.enabled
    with _GradModeAs(record):
        node_to_output_grads_list: Dict[Value, List[Value]] = {output_tensor: [out_grad]}
        # TensorTuple -> {component index: adjoint contributions} from the ops that picked it
        component_grads: Dict[Value, Dict[int, List[Value]]] = {}
        order = find_topo_sort([output_tensor])
        while order:
            node = order.pop()
            grads = node_to_output_grads_list.pop(node, None)
            picked = component_grads.pop(node, None)
            if picked is not None:
                grads = (grads or []) + [_tuple_adjoint(node, picked)]
            if grads is None:  # no path to the output needs this node
                continue
            grad = grads[0] if len(grads) == 1 else sum_node_list(grads)
            op = node.op
            if op is None or node._retains_grad:
                node.grad = grad if record or not grad.requires_grad else grad.detach()
            if op is None:  # a leaf
                continue
            if op.selects_component:
                if node.inputs[0].requires_grad:
                    picks = component_grads.setdefault(node.inputs[0], {})
                    picks.setdefault(op.index, []).append(grad)
                if not record:
                    _release(node)
                continue
            if not record and before_gradient is not None:
                before_gradient(node)
            _pass_on(node_to_output_grads_list, node.inputs, op.gradient_as_tuple(grad, node))
            if not record:
                _release(node)


class _GradModeAs:
    """``with _GradModeAs(mode):`` records the graph in this thread iff ``mode``, restoring
    the previous mode on exit: ``set_grad_enabled``'s block, without its decorator and
    statement machinery (entered once per backward pass)."""

    __slots__ = ("mode", "previous")

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)

    def __enter__(self) -> None:
        self.previous = previous = _grad_mode._enabled
        if previous is not self.mode:
            _grad_mode._set(self.mode, _grad_mode._lazy)

    def __exit__(self, *exc: object) -> None:
        if _grad_mode._enabled is not self.previous:
            _grad_mode._set(self.previous, _grad_mode._lazy)


class _Released(Op[Any]):
    """The op of a node whose graph a backward pass that recorded none has freed (see
    :func:`compute_gradient_of_variables`): the node keeps its array but no inputs."""

    def compute(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(_RELEASED_MESSAGE)

    def gradient(self, out_grad: Any, node: Any) -> Adjoints:
        raise RuntimeError(_RELEASED_MESSAGE)


_RELEASED_MESSAGE = (
    "this tensor's graph was freed by an earlier backward(create_graph=False) (or a backward "
    "inside no_grad()), which releases each node's inputs and saved arrays once it has passed "
    "its adjoint on, as PyTorch does: to backpropagate through a graph twice, call the first "
    "backward() with create_graph=True (the default), or run the forward pass again"
)
_RELEASED = _Released()


def _pass_on(
    adjoints: Dict[Value, List[Value]],
    inputs: Sequence[Value],
    grads: Tuple[Optional[Value], ...],
) -> None:
    """Append each input's adjoint contribution (a function, so that no loop variable of the
    pass keeps an input alive into the next node's turn: the opt-in fast backward counts the
    references to a node)."""
    for inp, inp_grad in zip(inputs, grads):
        if inp_grad is not None and inp.requires_grad:
            adjoints.setdefault(inp, []).append(inp_grad)


def _release(node: Value) -> None:
    """Cut ``node`` from its inputs (and free its op's saved arrays): it keeps its own array,
    so a Tensor the caller holds keeps its value; nodes that nobody else holds are then freed
    by reference counting. A node whose array was never computed (lazy mode) is left as is."""
    if node.cached_data is not None:
        node.op, node.inputs = _RELEASED, []


# question: hw1_topo_sort
def find_topo_sort(node_list: List[Value]) -> List[Value]:
    """Nodes reachable from ``node_list`` in topological order (inputs before consumers).

    The order is that of a post-order depth-first search starting from each node of
    ``node_list`` in turn and visiting ``inputs`` left to right, each node once.
    """
    visited: set[Value] = set()
    topo_order: List[Value] = []
    for node in node_list:
        topo_sort_dfs(node, visited, topo_order)
    return topo_order


# question: hw1_topo_sort
def topo_sort_dfs(node: Value, visited: set[Value], topo_order: List[Value]) -> None:
    """Post-order DFS from ``node``: appends every unvisited node after all its inputs.

    Iterative (an explicit stack), so deep graphs such as long RNN unrolls do not hit Python's
    recursion limit; the order equals that of the recursive definition.
    """
    if node in visited:
        return
    visited.add(node)
    stack = [(node, iter(node.inputs))]
    while stack:
        current, children = stack[-1]
        for child in children:
            if child not in visited:
                visited.add(child)
                stack.append((child, iter(child.inputs)))
                break
        else:
            stack.pop()
            topo_order.append(current)


def zero_adjoints(arrays: Iterable[NDArray]) -> List["Tensor"]:
    """Constant all-zero Tensors shaped like each array of ``arrays`` (one shared constant per
    shape, dtype and device), marked so that ``TensorTuple.__add__`` skips adding them."""
    zeros: Dict[Tuple[Tuple[int, ...], str, str], Tensor] = {}
    out = []
    for value in arrays:
        key = (tuple(value.shape), str(value.dtype), str(value.device))
        if key not in zeros:
            zero = Tensor.make_const(_full(value.shape, 0.0, value.dtype, value.device))
            zero._zero_adjoint = True
            zeros[key] = zero
        out.append(zeros[key])
    return out


def _tuple_adjoint(node: Value, picked: Dict[int, List[Value]]) -> Value:
    """The adjoint of TensorTuple ``node`` given the adjoints of its picked components (lists
    indexed by component): their sums, and zeros for the components nobody picked."""
    parts = node.realize_cached_data()
    unpicked = frozenset(i for i in range(len(parts)) if i not in picked)
    zeros = iter(zero_adjoints([parts[i] for i in sorted(unpicked)]))
    components: List[Value] = []
    for i in range(len(parts)):
        grads = picked.get(i)
        if grads is None:
            components.append(next(zeros))
        else:
            components.append(grads[0] if len(grads) == 1 else sum_node_list(grads))
    adjoint = needle.ops.make_tuple(*components)
    adjoint.zero_components = unpicked
    return adjoint


def sum_node_list(node_list: List[Value]) -> Value:
    """The sum of the values in ``node_list`` (with needle's ``+``)."""
    return reduce(add, node_list)


class _AutogradModule(types.ModuleType):
    """This module's class: ``autograd.LAZY_MODE`` reads and sets lazy mode for the calling
    thread, so the course's ``autograd.LAZY_MODE = True`` keeps working while one thread's lazy
    graph never makes another thread's ops skip their computation."""

    @property
    def LAZY_MODE(self) -> bool:  # noqa: N802 (the course's name)
        return bool(_grad_mode.lazy)

    @LAZY_MODE.setter
    def LAZY_MODE(self, value: bool) -> None:  # noqa: N802
        _grad_mode.lazy = bool(value)


sys.modules[__name__].__class__ = _AutogradModule
