"""Export a needle model to ONNX by tracing one forward pass, and check the result.

``to_onnx(model, example)`` runs ``model`` on ``example`` with a fresh input leaf, walks the
recorded graph in topological order and writes one ONNX node (or a few) per needle op. Leaves
other than the input (parameters, and any sub-graph that does not depend on the input, which
needle folds into a constant) become initializers. Shapes are static: the exported graph has
the example's batch size, like ``torch.onnx.export`` without dynamic axes; export once per batch
size.

A trace records only what needle's ops compute. A value the model reads out of the input in
Python (``x.numpy()``, ``x.detach()``) is a constant in the trace, so an exported graph would
return the example's result for every input. ``to_onnx`` therefore refuses, with a ValueError
naming the problem:

- any ``numpy()`` of a tensor that depends on the input, during the trace: whatever Python does
  with the value (a branch, a scalar, a new tensor) is fixed to this example's in the export
  (PyTorch's tracer warns; this refuses). ``Tensor.numpy`` is wrapped in the class while a trace
  runs (another thread's calls pass through unchecked);

- a model (an ``nn.Module``) in training mode: call ``model.eval()`` first (a training-mode pass
  draws Dropout masks and normalises with batch statistics; an inference graph cannot);
- an output that does not depend on the input;
- a graph whose constants or op attributes change with the input: the model is traced a second
  time on a perturbed input (``check_input``) and both traces must agree in everything but the
  input;
- an exported graph whose onnxruntime output on that second input differs from needle's.

``nn.Embedding`` (computed by needle as a gather whose ids are data held by the op, not a graph
input) exports as ``Cast`` + ``Gather``: while tracing, ``Embedding.forward`` is wrapped (in
the class, restored afterwards; another thread's Embedding sees the wrapper too) to mark its
output with an export-only op when the ids depend on the input, which is then the float ids,
as needle takes them; ids that do not (a positional embedding) export as a constant.
``stack``/``split`` export as ``Unsqueeze`` + ``Concat`` / ``Split`` + ``Squeeze``, so
``nn.RNN`` exports; an op with no ONNX translation (e.g. the fused LSTM layer or LayerNorm)
raises NotImplementedError "not supported: <op>".

Needs the ``onnx`` package (the ``lectures`` extra); the check needs ``onnxruntime``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from needle import autograd, ops
from needle.autograd import Tensor, TensorOp
from needle.fast import ops as ops_fused
from needle.nn import Module
from needle.nn.nn_sequence import Embedding
from needle.ops import ops_conv

try:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "needle.export needs the onnx package: pip install onnx (or the needle[lectures] extra)"
    ) from error

OPSET = 18  # reductions take their axes as an input (as ReduceSum does since 13)
# The second-input check: |onnxruntime - needle| may reach this fraction of needle's largest
# output entry (at least of 1.0): float32 kernels add in different orders.
CHECK_TOLERANCE = 1e-4

_ELEMENTWISE = {
    ops.EWiseAdd: "Add",
    ops.EWiseMul: "Mul",
    ops.EWiseDiv: "Div",
    ops.EWisePow: "Pow",
    ops.MatMul: "MatMul",
}
_UNARY = {ops.Negate: "Neg", ops.Exp: "Exp", ops.Log: "Log", ops.ReLU: "Relu", ops.Tanh: "Tanh"}
_SCALAR = {ops.AddScalar: "Add", ops.MulScalar: "Mul", ops.DivScalar: "Div", ops.PowerScalar: "Pow"}
_REDUCE = {ops.Summation: "ReduceSum", ops.LogSumExp: "ReduceLogSumExp"}

Names = Union[str, List[str]]  # the ONNX name of a Tensor, or the names of a TensorTuple's parts
# A node of the traced graph as the translation reads it: a Tensor (shape, numpy()) or a
# TensorTuple, which the op at hand tells apart; and the Names of its inputs, a str per Tensor
# and a list per TensorTuple. The type checker takes both on trust (Any).
Node = Any
InputNames = List[Any]


class _EmbeddingLookup(TensorOp):
    """Export-only marker of ``nn.Embedding``'s output: ``weight[ids]``, exported as a Gather.

    Its value is the module's own output, computed by needle and passed in, so the traced
    forward pass is exactly needle's. It has no gradient.
    """

    def __init__(self, value) -> None:
        self._value = value  # private: not compared between the two traces

    def compute(self, ids, weight):
        return self._value

    def gradient(self, out_grad, node):
        raise NotImplementedError("the export trace's embedding lookup has no gradient")


@contextlib.contextmanager
def _embeddings_as_lookups() -> Iterator[None]:
    """While tracing, every ``nn.Embedding`` whose ids depend on the traced input returns an
    ``_EmbeddingLookup`` node, whose ids are that input, instead of needle's lookup (whose ids
    are data held by the op, read from the input's values)."""
    original = Embedding.forward

    def forward(self: Embedding, x: Tensor) -> Tensor:
        _reads.allowed += 1  # needle's own lookup reads the ids: the hook exports them
        try:
            out = original(self, x)  # validates the ids and computes the value
        finally:
            _reads.allowed -= 1
        if not x.requires_grad:  # ids that do not depend on the input: a true constant
            return out
        return _EmbeddingLookup(out.realize_cached_data())(x, self.weight)

    Embedding.forward = forward  # type: ignore[method-assign]  # the hook, for the trace only
    try:
        yield
    finally:
        Embedding.forward = original  # type: ignore[method-assign]  # the hook removed


class _TraceReads(threading.local):
    """This thread's trace: its input leaf while a trace runs, and how many of needle's own
    reads of it (the Embedding hook) are in progress."""

    input: Optional[Tensor] = None
    allowed = 0


_reads = _TraceReads()
_numpy_hook_lock = threading.Lock()
_numpy_hook_users = 0  # traces running in any thread; Tensor.numpy is wrapped while > 0
_original_numpy = Tensor.numpy


def _checked_numpy(self: Tensor) -> np.ndarray:
    """``Tensor.numpy`` during a trace: refused for a tensor that depends on the input."""
    x = _reads.input
    if x is not None and not _reads.allowed and self.requires_grad:
        if any(node is x for node in autograd.find_topo_sort([self])):
            raise ValueError(
                f"to_onnx: the model reads the values of a tensor that depends on its input "
                f"(numpy() of a tensor of shape {tuple(self.shape)}): whatever Python computes "
                f"from them (a branch, a scalar, a new tensor) would be fixed to this "
                f"example's values in the exported graph; compute it with needle ops instead"
            )
    return _original_numpy(self)


@contextlib.contextmanager
def _refusing_reads_of(x: Tensor) -> Iterator[None]:
    """While this thread traces ``x``, its reads of values that depend on ``x`` raise."""
    global _numpy_hook_users
    with _numpy_hook_lock:
        _numpy_hook_users += 1
        Tensor.numpy = _checked_numpy  # type: ignore[method-assign]  # for the traces only
    _reads.input = x
    try:
        yield
    finally:
        _reads.input = None
        with _numpy_hook_lock:
            _numpy_hook_users -= 1
            if not _numpy_hook_users:
                Tensor.numpy = _original_numpy  # type: ignore[method-assign]


class _Builder:
    """Collects ONNX nodes and initializers with unique names."""

    def __init__(self) -> None:
        self.nodes: List[onnx.NodeProto] = []
        self.initializers: List[onnx.TensorProto] = []
        self.count = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, array: np.ndarray, stem: str = "const") -> str:
        name = self.fresh(stem)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values: Sequence[int], stem: str = "axes") -> str:
        return self.const(np.array(list(values), dtype=np.int64), stem)

    def node(self, op_type: str, inputs: List[str], **attrs) -> str:
        return self.nodes_out(op_type, inputs, 1, **attrs)[0]

    def nodes_out(self, op_type: str, inputs: List[str], n_out: int, **attrs) -> List[str]:
        """One ONNX node with ``n_out`` outputs; returns their names."""
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs


def _transpose_perm(op: ops.Transpose, ndim: int) -> List[int]:
    """The permutation needle's Transpose applies (it swaps two axes, default the last two)."""
    i, j = (ndim - 2, ndim - 1) if op.axes is None else (op.axes[0] % ndim, op.axes[1] % ndim)
    perm = list(range(ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return perm


def _reduce_axes(axes, ndim: int) -> List[int]:
    """needle's reduction ``axes`` (None: all, an int, or a sequence) as a list."""
    if axes is None:
        return list(range(ndim))
    return [axes] if isinstance(axes, int) else list(axes)


def _emit(b: _Builder, op, node: Node, args: InputNames) -> Names:
    """ONNX node(s) computing ``node`` = op(inputs) from the ONNX names ``args``."""
    kind = type(op)
    if kind in _ELEMENTWISE:
        return b.node(_ELEMENTWISE[kind], args)
    if kind in _UNARY:
        return b.node(_UNARY[kind], args)
    if kind in _SCALAR:
        scalar = b.const(np.array(op.scalar, dtype=np.float32), "scalar")
        return b.node(_SCALAR[kind], [args[0], scalar])
    if kind is ops.Reshape:
        return b.node("Reshape", [args[0], b.ints(op.shape, "shape")])
    if kind is ops.BroadcastTo:
        return b.node("Expand", [args[0], b.ints(op.shape, "shape")])
    if kind is ops.Transpose:
        return b.node("Transpose", args, perm=_transpose_perm(op, len(node.inputs[0].shape)))
    if kind is ops.Permute:
        ndim = len(node.inputs[0].shape)
        return b.node("Transpose", args, perm=[axis % ndim for axis in op.axes])
    if kind is ops.BiasAdd:  # the bias as a (C,) row, broadcast by ONNX's Add
        row = b.node("Reshape", [args[1], b.ints([node.shape[-1]], "shape")])
        return b.node("Add", [args[0], row])
    if kind is ops_fused.MatMulAddBias:  # nn.Linear's one node: MatMul, the bias row, Relu
        product = b.node("MatMul", args[:2])
        row = b.node("Reshape", [args[2], b.ints([node.shape[-1]], "shape")])
        out = b.node("Add", [product, row])
        return b.node("Relu", [out]) if op.relu else out
    if kind in _REDUCE:
        axes = _reduce_axes(op.axes, len(node.inputs[0].shape))
        if not axes:  # needle sums over no axis: the identity (ONNX would reduce over all)
            return b.node("Identity", args)
        return b.node(_REDUCE[kind], [args[0], b.ints(axes)], keepdims=0)
    if kind is ops_conv.Conv:
        # needle: NHWC input, (K, K, C_in, C_out) weight; ONNX: NCHW, (C_out, C_in, K, K)
        x = b.node("Transpose", [args[0]], perm=[0, 3, 1, 2])
        w = b.node("Transpose", [args[1]], perm=[3, 2, 0, 1])
        kh, kw = node.inputs[1].shape[:2]
        p = op.padding
        y = b.node(
            "Conv", [x, w], strides=[op.stride, op.stride], pads=[p, p, p, p], kernel_shape=[kh, kw]
        )
        return b.node("Transpose", [y], perm=[0, 2, 3, 1])
    if kind is ops_fused.EmbeddingLookup:  # ids that do not depend on the input: a constant
        ids = b.const(op.ids.numpy().astype(np.int64).reshape(op.shape), "ids")
        return b.node("Gather", [args[0], ids], axis=0)
    if kind is _EmbeddingLookup:
        ids = b.node("Cast", [args[0]], to=TensorProto.INT64)
        return b.node("Gather", [args[1], ids], axis=0)
    if kind is ops.MakeTensorTuple:
        return list(args)
    if kind is ops.TupleGetItem:
        return args[0][op.index]
    if kind is ops.Stack:  # args[0]: the parts' names; each gets the new axis, then Concat
        ndim = len(node.shape)
        axis = op.axis % ndim
        parts = [b.node("Unsqueeze", [name, b.ints([axis])]) for name in args[0]]
        return b.node("Concat", parts, axis=axis)
    if kind is ops.Split:
        shape = node.inputs[0].shape
        axis = op.axis % len(shape)
        pieces = b.nodes_out("Split", [args[0]], shape[axis], axis=axis, num_outputs=shape[axis])
        return [b.node("Squeeze", [piece, b.ints([axis])]) for piece in pieces]
    what = (
        "a TensorTuple"
        if isinstance(node, autograd.TensorTuple)
        else (f"a tensor of shape {tuple(node.shape)}")
    )
    raise NotImplementedError(
        f"needle.export: not supported: {kind.__name__} (the op producing "
        f"{what} has no ONNX translation)"
    )


def _refuse_training_mode(model: Callable) -> None:
    if not isinstance(model, Module):
        return
    training = [m for m in [model, *model.submodules()] if m.training]
    if training:
        kinds = sorted({type(m).__name__ for m in training})
        raise ValueError(
            f"to_onnx: the model is in training mode ({', '.join(kinds)}); call "
            f"model.eval() first: a training-mode forward pass draws Dropout masks "
            f"and normalises with batch statistics, which an exported inference "
            f"graph would bake in"
        )


def _perturbed(example: np.ndarray) -> np.ndarray:
    """A second input of the example's shape that differs from it: for integer-valued examples
    (ids, labels) other integers in the example's range, else the example plus Gaussian noise of
    the example's spread."""
    rng = np.random.default_rng(0)  # a private generator: the caller's seed state is untouched
    lo, hi = (float(example.min()), float(example.max())) if example.size else (0.0, 0.0)
    if np.all(example == np.round(example)) and lo < hi:
        other = rng.integers(int(lo), int(hi) + 1, size=example.shape).astype(np.float32)
        if np.array_equal(other, example):
            other = np.where(example == lo, hi, lo).astype(np.float32)
        return other
    scale = float(example.std()) or max(abs(lo), abs(hi), 1.0)
    return (example + scale * rng.standard_normal(example.shape)).astype(np.float32)


def _trace(model: Callable, example: np.ndarray):
    """(input leaf, output, topological order) of one recorded forward pass on ``example``."""
    x = Tensor(example, requires_grad=True)  # so that every node depending on it is recorded
    with autograd.enable_grad(), _embeddings_as_lookups(), _refusing_reads_of(x):
        out = model(x)
    if not isinstance(out, Tensor):
        raise TypeError(f"to_onnx: the model must return a Tensor, got {type(out).__name__}")
    if out is x:
        raise ValueError("to_onnx: the model returned its input unchanged")
    order = autograd.find_topo_sort([out])
    if not any(node is x for node in order):
        raise ValueError(
            "to_onnx: the model's output does not depend on its input (the trace "
            "never reaches it): the model computes it from the input's values "
            "outside needle's ops (x.numpy(), x.detach()), so an exported graph "
            "would return this example's output for every input"
        )
    return x, out, order


def _public_attrs(op) -> dict:
    return {k: v for k, v in vars(op).items() if not k.startswith("_")}


def _same(a, b) -> bool:
    """Equality of two op attributes (numbers, tuples, arrays, tensors)."""
    if a is b:
        return True
    a, b = (v.numpy() if hasattr(v, "numpy") else v for v in (a, b))
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        a, b = np.asarray(a), np.asarray(b)
        return np.array_equal(a, b, equal_nan=a.dtype.kind == "f" and b.dtype.kind == "f")
    return bool(a == b)


def _consumer(order: List[Node], leaf: Node) -> str:
    for node in order:
        if any(i is leaf for i in node.inputs):
            return type(node.op).__name__
    return "the output"


def _compare_traces(order: List[Node], x: Tensor, order2: List[Node], x2: Tensor) -> None:
    """Raise ValueError where the trace on the second input differs from the first in anything
    but the input: its structure, an op attribute, or a constant's value."""
    hint = (
        "the model computes it from the input's values outside needle's ops (x.numpy(), "
        "x.detach(), a Python-side lookup) or draws it at random (Dropout in training "
        "mode), so the exported graph would bake in this example's value"
    )
    if len(order) != len(order2):
        raise ValueError(
            f"to_onnx: the traced graph changes with the input ({len(order)} vs "
            f"{len(order2)} nodes): data-dependent control flow cannot be exported"
        )
    for k, (a, b) in enumerate(zip(order, order2)):
        if (a is x) != (b is x2) or type(a.op) is not type(b.op):
            what = ["the input" if n is x or n is x2 else type(n.op).__name__ for n in (a, b)]
            raise ValueError(
                f"to_onnx: the traced graph changes with the input (node {k} is "
                f"{what[0]} in one trace, {what[1]} in the other): data-dependent "
                f"control flow cannot be exported"
            )
        if a is x or a is b:
            continue
        if a.op is None:
            if not _same(a.numpy(), b.numpy()):
                raise ValueError(
                    f"to_onnx: a constant of shape {tuple(a.shape)} (an input of "
                    f"{_consumer(order, a)}) changes with the input: {hint}"
                )
            continue
        attrs, attrs2 = _public_attrs(a.op), _public_attrs(b.op)
        for key in attrs:
            if not _same(attrs[key], attrs2.get(key)):
                raise ValueError(
                    f"to_onnx: the attribute {key} of {type(a.op).__name__} "
                    f"changes with the input ({attrs[key]!r} vs "
                    f"{attrs2.get(key)!r}): {hint}"
                )


def _check_on_second_input(
    model_proto: "onnx.ModelProto", check_input: np.ndarray, want: np.ndarray
) -> None:
    """Run the exported model in onnxruntime on ``check_input``; raise ValueError where it
    differs from needle's output ``want`` on the same input."""
    try:
        import onnxruntime as ort
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "to_onnx checks the export with onnxruntime: pip install onnxruntime "
            "(or the needle[lectures] extra), or pass check=False"
        ) from error
    session = ort.InferenceSession(
        model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got = session.run(None, {"input": check_input})[0]
    finite = np.abs(want[np.isfinite(want)])
    tol = CHECK_TOLERANCE * max(float(finite.max(initial=0.0)), 1.0)
    if got.shape != want.shape:
        raise ValueError(
            f"to_onnx: on a second input the exported model's output has shape "
            f"{got.shape}, needle's {want.shape}"
        )
    bad = ~np.isclose(got, want, rtol=0.0, atol=tol, equal_nan=True)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise ValueError(
            f"to_onnx: the exported model disagrees with needle on a second input: "
            f"{int(bad.sum())} of {bad.size} entries differ by more than {tol:.3g}, "
            f"first at index {i} (onnxruntime {got[i]!r}, needle {want[i]!r})"
        )


def _build(order: List[Node], x: Tensor, out: Tensor, shape: tuple, name: str) -> "onnx.ModelProto":
    """The checked ONNX model of the traced graph ``order`` (input ``x``, output ``out``)."""
    b = _Builder()
    names: Dict[int, Names] = {id(x): "input"}
    for node in order:
        if id(node) in names:
            continue
        if node.op is None:  # a parameter or a folded constant
            names[id(node)] = b.const(node.numpy().astype(np.float32), "param")
            continue
        names[id(node)] = _emit(b, node.op, node, [names[id(i)] for i in node.inputs])
    # the output is a Tensor: one name, not a list
    b.nodes.append(helper.make_node("Identity", [names[id(out)]], ["output"]))  # type: ignore[list-item]
    graph = helper.make_graph(
        b.nodes,
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(out.shape))],
        initializer=b.initializers,
    )
    model_proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="needle"
    )
    model_proto.ir_version = 8  # readable by onnxruntime releases from 1.14 on
    onnx.checker.check_model(model_proto, full_check=True)
    return model_proto


def to_onnx(
    model: Callable[[Tensor], Tensor],
    example: Union[np.ndarray, Tensor],
    path: Optional[str] = None,
    name: str = "needle_model",
    check_input: Optional[np.ndarray] = None,
    check: bool = True,
) -> "onnx.ModelProto":
    """Trace ``model(example)`` and return it as a checked ONNX model (saved to ``path`` if given).

    ``example``: one input batch (numpy array or Tensor, cast to float32), e.g. (N, features),
    (N, C, H, W) or (seq_len, bs) ids; its shape is fixed in the graph. The graph has one input
    ``input`` and one output ``output`` of the traced output's shape. ``check_input`` (same
    shape; default: a perturbation of ``example``, see the module docstring) is traced too and,
    if ``check``, run through onnxruntime and compared with needle. Raises ValueError for a
    model in training mode or one whose export would ignore its input, NotImplementedError for
    an op with no translation.
    """
    if isinstance(example, Tensor):
        example = example.numpy()
    if not isinstance(example, np.ndarray):
        raise TypeError(
            f"to_onnx: example must be a numpy array or a Tensor, got {type(example).__name__}"
        )
    if autograd.LAZY_MODE:
        raise RuntimeError("to_onnx traces an eager forward pass: turn LAZY_MODE off")
    example = example.astype(np.float32)
    if check_input is None:
        check_input = _perturbed(example)
    elif not isinstance(check_input, np.ndarray) or check_input.shape != example.shape:
        raise ValueError(
            f"to_onnx: check_input must be a numpy array of the example's shape "
            f"{example.shape}, got {getattr(check_input, 'shape', check_input)!r}"
        )
    check_input = check_input.astype(np.float32)
    _refuse_training_mode(model)

    x, out, order = _trace(model, example)
    model_proto = _build(order, x, out, example.shape, name)  # raises for unsupported ops
    try:
        x2, out2, order2 = _trace(model, check_input)
    except (ValueError, IndexError, TypeError) as error:
        raise ValueError(
            f"to_onnx: the model failed on the second (check) input: {error}; pass "
            f"check_input=, another valid input of shape {example.shape}"
        ) from error
    _compare_traces(order, x, order2, x2)
    if check:
        _check_on_second_input(model_proto, check_input, out2.numpy().astype(np.float32))
    if path is not None:
        onnx.save(model_proto, path)
    return model_proto
