"""Reference answers to the exercises of notebooks/13_deployment_and_compilation (try them
first)."""
import numpy as np
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import te


def fold_batchnorm(W, b, gamma, beta, mean, var, eps):
    """(W', b') of the single Linear equal to Linear(W, b) then BatchNorm1d in eval mode."""
    # BN(z) = gamma (z - mean) / sqrt(var + eps) + beta = s z + (beta - s mean), per feature
    s = gamma / np.sqrt(var + eps)
    return W * s, (b - mean) * s + beta


def mlp_to_onnx(W1, b1, W2, b2, batch):
    """An onnx.ModelProto of the two-layer MLP for inputs of shape (batch, 6)."""
    params = {"W1": W1, "b1": b1, "W2": W2, "b2": b2}
    nodes = [helper.make_node("MatMul", ["input", "W1"], ["xw1"]),
             helper.make_node("Add", ["xw1", "b1"], ["z1"]),
             helper.make_node("Relu", ["z1"], ["h"]),
             helper.make_node("MatMul", ["h", "W2"], ["hw2"]),
             helper.make_node("Add", ["hw2", "b2"], ["output"])]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, W1.shape[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, W2.shape[1]])],
        initializer=[numpy_helper.from_array(np.asarray(v, dtype=np.float32), name)
                     for name, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def linear_relu_compute(X, W, b):
    """The te.Tensor Y = max(X @ W + b, 0) for te placeholders X, W, b (stages "S", "Y")."""
    n, k_dim = X.shape
    m = W.shape[1]
    k = te.reduce_axis((0, k_dim), name="k")
    S = te.compute((n, m), lambda i, j: te.sum(X[i, k] * W[k, j], axis=k), name="S")
    return te.compute((n, m), lambda i, j: tvm.tirx.max(S[i, j] + b[j],
                                                        tvm.tirx.const(0.0, "float32")),
                      name="Y")


def fuse_linear_relu(sch):
    """The schedule ``sch`` of linear_relu_compute's program with Y computed inside S's loops."""
    # S's loops are i, j, k: under j, one element of S is summed over k, then Y reads it at
    # once, so S shrinks to a single element (under i it would be one row)
    i, j, k = sch.get_loops(sch.get_sblock("S"))
    sch.reverse_compute_at(sch.get_sblock("Y"), j)
    return sch


def tile_and_vectorize(sch, ti, tj, tk):
    """The schedule ``sch`` of the matmul, tiled ti x tj x tk with j1 vectorized."""
    block = sch.get_sblock("C")
    i, j, k = sch.get_loops(block)
    i0, i1 = sch.split(i, [None, ti])
    j0, j1 = sch.split(j, [None, tj])
    k0, k1 = sch.split(k, [None, tk])
    sch.reorder(i0, j0, k0, i1, k1, j1)
    sch.vectorize(j1)
    sch.decompose_reduction(block, k0)
    return sch
