"""Export a needle model to ONNX by tracing one forward pass.

``to_onnx(model, example)`` runs ``model`` on ``example`` with a fresh input leaf, walks the
recorded graph in topological order and writes one ONNX node (or a few) per needle op. Leaves
other than the input (parameters, and any sub-graph that does not depend on the input, which
needle folds into a constant) become initializers. Shapes are static: the exported graph has
the example's batch size, like ``torch.onnx.export`` without dynamic axes; export once per batch
size. Put the model in ``eval()`` mode first (the trace records whatever the forward pass does).

Needs the ``onnx`` package (the ``lectures`` extra); running the file needs ``onnxruntime``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Union

import numpy as np

from needle import autograd, ops
from needle.autograd import Tensor
from needle.ops import ops_conv

try:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("needle.export needs the onnx package: pip install onnx (or the "
                      "needle[lectures] extra)") from error

OPSET = 18  # reductions take their axes as an input (as ReduceSum does since 13)

_ELEMENTWISE = {
    ops.EWiseAdd: "Add", ops.EWiseMul: "Mul", ops.EWiseDiv: "Div", ops.EWisePow: "Pow",
    ops.MatMul: "MatMul",
}
_UNARY = {ops.Negate: "Neg", ops.Exp: "Exp", ops.Log: "Log", ops.ReLU: "Relu", ops.Tanh: "Tanh"}
_SCALAR = {ops.AddScalar: "Add", ops.MulScalar: "Mul", ops.DivScalar: "Div",
           ops.PowerScalar: "Pow"}


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

    def node(self, op_type: str, inputs: List[str], **attrs) -> str:
        out = self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out


def _transpose_perm(op: ops.Transpose, ndim: int) -> List[int]:
    """The permutation needle's Transpose applies (it swaps two axes, default the last two)."""
    i, j = (ndim - 2, ndim - 1) if op.axes is None else (op.axes[0] % ndim, op.axes[1] % ndim)
    perm = list(range(ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return perm


def _emit(b: _Builder, op, node: Tensor, args: List[str]) -> str:
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
        return b.node("Reshape", [args[0], b.const(np.array(op.shape, dtype=np.int64), "shape")])
    if kind is ops.BroadcastTo:
        return b.node("Expand", [args[0], b.const(np.array(op.shape, dtype=np.int64), "shape")])
    if kind is ops.Transpose:
        return b.node("Transpose", args, perm=_transpose_perm(op, len(node.inputs[0].shape)))
    if kind is ops.Summation:
        ndim = len(node.inputs[0].shape)
        axes = op.axes
        axes = list(range(ndim)) if axes is None else [axes] if isinstance(axes, int) else axes
        return b.node("ReduceSum", [args[0], b.const(np.array(axes, dtype=np.int64), "axes")],
                      keepdims=0)
    if kind is ops.LogSumExp:
        ndim = len(node.inputs[0].shape)
        axes = list(range(ndim)) if op.axes is None else (
            [op.axes] if isinstance(op.axes, int) else list(op.axes))
        return b.node("ReduceLogSumExp",
                      [args[0], b.const(np.array(axes, dtype=np.int64), "axes")], keepdims=0)
    if kind is ops_conv.Conv:
        # needle: NHWC input, (K, K, C_in, C_out) weight; ONNX: NCHW, (C_out, C_in, K, K)
        x = b.node("Transpose", [args[0]], perm=[0, 3, 1, 2])
        w = b.node("Transpose", [args[1]], perm=[3, 2, 0, 1])
        kh, kw = node.inputs[1].shape[:2]
        p = op.padding
        y = b.node("Conv", [x, w], strides=[op.stride, op.stride], pads=[p, p, p, p],
                   kernel_shape=[kh, kw])
        return b.node("Transpose", [y], perm=[0, 2, 3, 1])
    raise NotImplementedError(f"needle.export: no ONNX translation for the op "
                              f"{kind.__name__} (node of shape {tuple(node.shape)})")


def to_onnx(model: Callable[[Tensor], Tensor], example: Union[np.ndarray, Tensor],
            path: Optional[str] = None, name: str = "needle_model") -> "onnx.ModelProto":
    """Trace ``model(example)`` and return it as a checked ONNX model (saved to ``path`` if given).

    ``example``: one input batch (numpy array or Tensor, float32), e.g. (N, features) or
    (N, C, H, W); its shape is fixed in the graph. The graph has one input ``input`` and one
    output ``output`` of the traced output's shape.
    """
    if isinstance(example, Tensor):
        example = example.numpy()
    if not isinstance(example, np.ndarray):
        raise TypeError(f"to_onnx: example must be a numpy array or a Tensor, got "
                        f"{type(example).__name__}")
    if autograd.LAZY_MODE:
        raise RuntimeError("to_onnx traces an eager forward pass: turn LAZY_MODE off")
    example = example.astype(np.float32)
    x = Tensor(example, requires_grad=True)  # so that every node depending on it is recorded
    out = model(x)
    if not isinstance(out, Tensor):
        raise TypeError(f"to_onnx: the model must return a Tensor, got {type(out).__name__}")
    if out is x:
        raise ValueError("to_onnx: the model returned its input unchanged")
    b = _Builder()
    names: Dict[int, str] = {id(x): "input"}
    for node in autograd.find_topo_sort([out]):
        if id(node) in names:
            continue
        if node.op is None:  # a parameter or a folded constant
            names[id(node)] = b.const(node.numpy().astype(np.float32), "param")
            continue
        names[id(node)] = _emit(b, node.op, node, [names[id(i)] for i in node.inputs])
    b.nodes.append(helper.make_node("Identity", [names[id(out)]], ["output"]))
    graph = helper.make_graph(
        b.nodes, name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(example.shape))],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, list(out.shape))],
        initializer=b.initializers)
    model_proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                    producer_name="needle")
    model_proto.ir_version = 8  # readable by onnxruntime releases from 1.14 on
    onnx.checker.check_model(model_proto, full_check=True)
    if path is not None:
        onnx.save(model_proto, path)
    return model_proto
