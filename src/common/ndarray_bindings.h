// The entry points that both compiled device modules bind (ndarray_backend_cpu.cc and
// ndarray_backend_cuda_module.cc), listed once. Each module expands a list with its own binder,
// so a name, its arguments and its docstring are written here only. The element-wise op
// tables are in ndarray_ops.h.
#pragma once

#include <pybind11/pybind11.h>

namespace needle::bind {
// A keyword argument that refuses None: a None buffer would reach a kernel as a null pointer.
inline pybind11::arg arg(const char* name) { return pybind11::arg(name).none(false); }

// m.def(name, f) with a docstring, the GIL released while f runs, and one keyword argument
// (refusing None) per name: how both modules bind the lists below.
template <class F, class... Names>
void def_nogil(pybind11::module_& m, const char* name, F f, const char* doc, Names... names) {
  m.def(name, f, doc, pybind11::call_guard<pybind11::gil_scoped_release>(), arg(names)...);
}
}  // namespace needle::bind

// The course's compact entry points (hw3's names) over buffers of one size:
// ewise_<name>(a, b, out) and scalar_<name>(a, val, out) for each op of NEEDLE_COURSE_BINARY,
// scalar_<name>(a, val, out) alone for NEEDLE_COURSE_SCALAR, ewise_<name>(a, out) for
// NEEDLE_COURSE_UNARY. Every name is also an op of ndarray_ops.h.
#define NEEDLE_COURSE_BINARY(X) X(add) X(mul) X(div) X(maximum) X(eq) X(ge)
#define NEEDLE_COURSE_SCALAR(X) X(power)
#define NEEDLE_COURSE_UNARY(X) X(log) X(exp) X(tanh)

// The fused kernels (see needle/backend_ndarray/protocol.py): X(name, docstring, argument names).
// Adding one: a line here, its function in each module (fused::name on the CPU, name in the
// CUDA bindings), its Python reference in numpy_kernels.py.
#define NEEDLE_FUSED_KERNELS(X)                                                                     \
  X(softmax_xent,                                                                                   \
    "Per row: loss = logsumexp(logits) - logits[label], probs = softmax(logits) (rows x cols); "    \
    "ValueError for a label outside [0, cols).",                                                    \
    "logits", "labels", "rows", "cols", "loss", "probs")                                            \
  X(softmax_xent_bwd,                                                                               \
    "dlogits (rows x cols) = (probs - one_hot(labels)) * dloss * scale, dloss per row (rows "       \
    "elements) or shared (one); dlogits may be probs itself. ValueError for a label outside "      \
    "[0, cols).",                                                                                   \
    "probs", "labels", "dloss", "rows", "cols", "scale", "dlogits")                                 \
  X(softmax_fwd,                                                                                    \
    "y (rows x cols) = softmax of each row of scale * x; queries > 0 masks causally: row r sees "   \
    "keys j <= r % queries + cols - queries (the others get 0).",                                   \
    "x", "rows", "cols", "scale", "queries", "y")                                                   \
  X(softmax_bwd, "dx = scale * y * (dy - sum(dy * y)) per row: the gradient of softmax_fwd.",       \
    "y", "dy", "rows", "cols", "scale", "dx")                                                       \
  X(attention_fwd,                                                                                  \
    "Per head: probs (queries x keys) = softmax of scale * q k^T (causal = 1: query i sees keys "    \
    "j <= i + keys - queries), out (queries x dim) = probs v; q (heads, queries, dim), k and v "    \
    "(heads, keys, dim).",                                                                          \
    "q", "k", "v", "heads", "queries", "dim", "keys", "scale", "causal", "out", "probs")            \
  X(attention_bwd,                                                                                  \
    "The exact gradients dq, dk, dv of attention_fwd given the adjoints d_out of out and d_probs "  \
    "of probs, and its saved probs.",                                                               \
    "d_out", "d_probs", "probs", "q", "k", "v", "heads", "queries", "dim", "keys", "scale", "dq",   \
    "dk", "dv")                                                                                     \
  X(layernorm_fwd,                                                                                  \
    "Row-wise LayerNorm of x (rows x cols): xhat, rstd (rows) and y = xhat * w + b.",               \
    "x", "w", "b", "rows", "cols", "eps", "y", "xhat", "rstd")                                      \
  X(layernorm_bwd, "The exact gradients dx (rows x cols), dw, db (cols) of layernorm_fwd.",         \
    "dy", "xhat", "rstd", "w", "rows", "cols", "dx", "dw", "db")                                    \
  X(batchnorm_fwd,                                                                                  \
    "Column-wise BatchNorm of x (rows x cols) over the rows: xhat, y, and per column rstd, "        \
    "mean and biased var.",                                                                         \
    "x", "w", "b", "rows", "cols", "eps", "y", "xhat", "rstd", "mean", "var")                       \
  X(batchnorm_bwd, "The exact gradients dx (rows x cols), dw, db (cols) of batchnorm_fwd.",         \
    "dy", "xhat", "rstd", "w", "rows", "cols", "dx", "dw", "db")                                    \
  X(lstm_cell_fwd,                                                                                  \
    "One LSTM step from gate pre-activations (batch x 4*hidden, order i, f, g, o).",                \
    "gates", "c_prev", "batch", "hidden", "h", "c", "act", "tanh_c")                                \
  X(lstm_cell_bwd, "The exact gradients dgates (batch x 4*hidden) and dc_prev of lstm_cell_fwd.",   \
    "dh", "dc", "act", "c_prev", "tanh_c", "batch", "hidden", "dgates", "dc_prev")                  \
  X(lstm_layer_fwd,                                                                                 \
    "An LSTM layer over steps: gates_t = xw[t] + h_{t-1} @ w_hh (h_{-1} = h0, c_{-1} = c0), then "  \
    "lstm_cell_fwd; out (steps x batch x hidden) holds every h_t, act every step's activations, "   \
    "h and c the last state.",                                                                      \
    "xw", "h0", "c0", "w_hh", "batch", "hidden", "steps", "out", "h", "c", "act")                   \
  X(lstm_layer_bwd,                                                                                 \
    "The exact gradients dxw, dh0, dc0 and dw_hh of lstm_layer_fwd given the adjoints d_out, dh, "  \
    "dc of out, h, c and its saved act and out (the cell states are recomputed from act).",         \
    "d_out", "dh", "dc", "act", "out", "h0", "c0", "w_hh", "batch", "hidden", "steps", "dxw",       \
    "dh0", "dc0", "dw_hh")                                                                          \
  X(sgd_update,                                                                                     \
    "In place: g = grad + wd*param; buf = momentum*buf + (1-momentum)*g; param -= lr*buf.",         \
    "param", "grad", "buf", "lr", "momentum", "weight_decay")                                       \
  X(adam_update, "In place Adam step with bias corrections (step >= 1) on param, m and v.",         \
    "param", "grad", "m", "v", "lr", "beta1", "beta2", "eps", "weight_decay", "step")              \
  X(embedding_gather,                                                                               \
    "out (rows x cols) = weight[ids] for weight (vocab x cols) and ids (rows), whole numbers in "   \
    "[0, vocab); IndexError naming an id outside that range.",                                      \
    "weight", "ids", "vocab", "cols", "rows", "out")                                                \
  X(embedding_scatter_add,                                                                          \
    "out (vocab x cols) = zeros, then out[ids[r]] += grad[r] for each row of grad (rows x cols): "  \
    "repeated ids accumulate; IndexError naming an id outside [0, vocab).",                         \
    "grad", "ids", "rows", "cols", "vocab", "out")

// The convolution kernels (protocol.py; checks in ndarray_checks_conv.h), bound like the fused
// kernels: X(name, docstring, argument names). NHWC input (n, h, w, c_in), (kh, kw, c_in, c_out)
// weight, output (n, h_out, w_out, c_out) with h_out = (h + 2*padding - kh) / stride + 1.
#define NEEDLE_CONV_KERNELS(X)                                                                      \
  X(conv_fwd,                                                                                       \
    "out (n, h_out, w_out, c_out) = the convolution (cross-correlation) of x (n, h, w, c_in), "     \
    "zero-padded by padding, with weight (kh, kw, c_in, c_out) at stride; ValueError for bad "      \
    "sizes.",                                                                                       \
    "x", "weight", "n", "h", "w", "c_in", "kh", "kw", "c_out", "stride", "padding", "out")          \
  X(conv_input_grad,                                                                                \
    "out (n, h, w, c_in) = the adjoint of conv_fwd for the input, given the output adjoint grad "   \
    "(n, h_out, w_out, c_out) and weight (kh, kw, c_in, c_out).",                                   \
    "grad", "weight", "kh", "kw", "c_in", "c_out", "n", "h", "w", "stride", "padding", "out")       \
  X(conv_weight_grad,                                                                               \
    "out (kh, kw, c_in, c_out) = the adjoint of conv_fwd for the weight, given the input x "        \
    "(n, h, w, c_in) and the output adjoint grad (n, h_out, w_out, c_out).",                        \
    "x", "grad", "n", "h", "w", "c_in", "kh", "kw", "c_out", "stride", "padding", "out")
