// Argument checks shared by the bindings of needle's compiled device modules (C++ CPU and
// CUDA). Kernels trust their arguments; every binding calls these first.
//
// Error policy (the same in every layer of needle): a wrong value — a view that leaves its
// buffer, sizes that disagree, an unknown op code — throws std::invalid_argument, which
// pybind11 raises as ValueError; the message names the function and the numbers involved.
// (TypeError is for a wrong kind of value and pybind11 raises it itself for wrong argument
// types; IndexError is for subscripts only and is raised by NDArray.__getitem__ in Python.)
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace needle::checks {

using idx_t = int64_t;
// Largest element count any buffer or view may have (keeps every index product in int64).
constexpr idx_t kMaxElements = idx_t(1) << 50;

inline std::string tuple_str(const std::vector<idx_t>& v) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  if (v.size() == 1) s << ",";
  s << ")";
  return s.str();
}

[[noreturn]] inline void fail(const std::string& fn, const std::string& msg) {
  throw std::invalid_argument(fn + ": " + msg);
}

// Number of elements of `shape`; throws for a negative dimension or more than kMaxElements.
inline idx_t shape_size(const std::string& fn, const std::vector<idx_t>& shape) {
  __int128 size = 1;
  for (idx_t d : shape) {
    if (d < 0) fail(fn, "negative dimension in shape " + tuple_str(shape));
    size *= d;
    if (size > kMaxElements) fail(fn, "shape " + tuple_str(shape) + " has too many elements");
  }
  return idx_t(size);
}

// Checks that the strided view (shape, strides, offset) lies inside a buffer of `buf_size`
// elements (strides may be zero or negative) and returns its number of elements.
inline idx_t check_view(const std::string& fn, const std::vector<idx_t>& shape,
                        const std::vector<idx_t>& strides, idx_t offset, idx_t buf_size) {
  if (shape.size() != strides.size())
    fail(fn, "shape " + tuple_str(shape) + " and strides " + tuple_str(strides) +
                 " differ in length");
  idx_t size = shape_size(fn, shape);
  if (size == 0) return 0;
  __int128 lo = offset, hi = offset;
  for (size_t d = 0; d < shape.size(); ++d) {
    __int128 ext = __int128(shape[d] - 1) * strides[d];
    (ext < 0 ? lo : hi) += ext;
  }
  if (lo < 0 || hi >= buf_size) {
    std::ostringstream s;
    s << "view with shape " << tuple_str(shape) << ", strides " << tuple_str(strides)
      << " and offset " << offset << " reaches elements [" << int64_t(lo) << ", " << int64_t(hi)
      << "], outside the buffer of " << buf_size << " elements";
    fail(fn, s.str());
  }
  return size;
}

// Checks that a buffer named `what` holds exactly `expected` elements.
inline void check_size(const std::string& fn, const char* what, idx_t got, idx_t expected) {
  if (got != expected) {
    std::ostringstream s;
    s << what << " has " << got << " elements, expected " << expected;
    fail(fn, s.str());
  }
}

// Checks that a buffer named `what` holds at least `needed` elements.
inline void check_at_least(const std::string& fn, const char* what, idx_t got, idx_t needed) {
  if (got < needed) {
    std::ostringstream s;
    s << what << " has " << got << " elements, needs at least " << needed;
    fail(fn, s.str());
  }
}

// Checks an op code against the size of its table.
inline void check_op(const std::string& fn, int op, int count) {
  if (op < 0 || op >= count)
    fail(fn, "unknown op code " + std::to_string(op) + " (valid: 0.." + std::to_string(count - 1) +
                 ")");
}

// Checks that every size is non-negative (m, n, p of a matmul, rows/cols of a fused kernel).
inline void check_sizes(const std::string& fn, std::initializer_list<idx_t> sizes) {
  for (idx_t s : sizes)
    if (s < 0) fail(fn, "negative size " + std::to_string(s));
}

// ---- the buffers of the fused kernels (the last section of protocol.py) -------------------------
// Each checks that every buffer holds exactly the elements its kernel reads or writes; the CPU
// and CUDA modules call these with their own array types (anything with a `size`).

template <class A>
void check_softmax_xent(const char* fn, const A& logits, const A& labels, idx_t rows,
                        idx_t cols, const A& loss, const A& probs) {
  const idx_t n = shape_size(fn, {rows, cols});
  check_size(fn, "logits", logits.size, n);
  check_size(fn, "labels", labels.size, rows);
  check_size(fn, "loss", loss.size, rows);
  check_size(fn, "probs", probs.size, n);
}

// softmax_xent_bwd: probs and dlogits (rows, cols), labels (rows,), dloss (rows,) or one element
// shared by every row.
template <class A>
void check_softmax_xent_bwd(const char* fn, const A& probs, const A& labels, const A& dloss,
                            idx_t rows, idx_t cols, const A& dlogits) {
  const idx_t n = shape_size(fn, {rows, cols});
  check_size(fn, "probs", probs.size, n);
  check_size(fn, "labels", labels.size, rows);
  if (dloss.size != 1) check_size(fn, "dloss", dloss.size, rows);
  check_size(fn, "dlogits", dlogits.size, n);
}

// layernorm_fwd and batchnorm_fwd: x, y, xhat (rows, cols); w, b (cols,); rstd (stats,) with
// stats = rows for layer norm and cols for batch norm (see check_batchnorm_fwd).
template <class A>
void check_norm_fwd(const char* fn, const A& x, const A& w, const A& b, idx_t rows, idx_t cols,
                    idx_t stats, const A& y, const A& xhat, const A& rstd) {
  const idx_t n = shape_size(fn, {rows, cols});
  check_size(fn, "x", x.size, n);
  check_size(fn, "w", w.size, cols);
  check_size(fn, "b", b.size, cols);
  check_size(fn, "y", y.size, n);
  check_size(fn, "xhat", xhat.size, n);
  check_size(fn, "rstd", rstd.size, stats);
}

// batchnorm_fwd: check_norm_fwd with statistics per column, at least one row (the batch), and
// the batch mean and variance (cols,).
template <class A>
void check_batchnorm_fwd(const char* fn, const A& x, const A& w, const A& b, idx_t rows,
                         idx_t cols, const A& y, const A& xhat, const A& rstd, const A& mean,
                         const A& var) {
  if (rows < 1) fail(fn, "needs at least one row (the batch), got rows=" + std::to_string(rows));
  check_norm_fwd(fn, x, w, b, rows, cols, cols, y, xhat, rstd);
  check_size(fn, "mean", mean.size, cols);
  check_size(fn, "var", var.size, cols);
}

// layernorm_bwd and batchnorm_bwd; stats as for check_norm_fwd.
template <class A>
void check_norm_bwd(const char* fn, const A& dy, const A& xhat, const A& rstd, const A& w,
                    idx_t rows, idx_t cols, idx_t stats, const A& dx, const A& dw,
                    const A& db) {
  const idx_t n = shape_size(fn, {rows, cols});
  check_size(fn, "dy", dy.size, n);
  check_size(fn, "xhat", xhat.size, n);
  check_size(fn, "rstd", rstd.size, stats);
  check_size(fn, "w", w.size, cols);
  check_size(fn, "dx", dx.size, n);
  check_size(fn, "dw", dw.size, cols);
  check_size(fn, "db", db.size, cols);
}

template <class A>
void check_lstm_cell_fwd(const char* fn, const A& gates, const A& c_prev, idx_t batch,
                         idx_t hidden, const A& h, const A& c, const A& act, const A& tanh_c) {
  const idx_t n = shape_size(fn, {batch, hidden}), n4 = shape_size(fn, {batch, 4, hidden});
  check_size(fn, "gates", gates.size, n4);
  check_size(fn, "c_prev", c_prev.size, n);
  check_size(fn, "h", h.size, n);
  check_size(fn, "c", c.size, n);
  check_size(fn, "act", act.size, n4);
  check_size(fn, "tanh_c", tanh_c.size, n);
}

template <class A>
void check_lstm_cell_bwd(const char* fn, const A& dh, const A& dc, const A& act,
                         const A& c_prev, const A& tanh_c, idx_t batch, idx_t hidden,
                         const A& dgates, const A& dc_prev) {
  const idx_t n = shape_size(fn, {batch, hidden}), n4 = shape_size(fn, {batch, 4, hidden});
  check_size(fn, "dh", dh.size, n);
  check_size(fn, "dc", dc.size, n);
  check_size(fn, "act", act.size, n4);
  check_size(fn, "c_prev", c_prev.size, n);
  check_size(fn, "tanh_c", tanh_c.size, n);
  check_size(fn, "dgates", dgates.size, n4);
  check_size(fn, "dc_prev", dc_prev.size, n);
}

// ---- an LSTM layer over a sequence: (steps, batch, hidden) sequences, (batch, hidden) states,
// (steps, batch, 4*hidden) gates and w_hh (hidden, 4*hidden) --------------------------------------
struct LstmLayerSizes {
  idx_t state, seq, gates, w;
};

inline LstmLayerSizes lstm_layer_sizes(const char* fn, idx_t batch, idx_t hidden, idx_t steps) {
  check_sizes(fn, {batch, hidden, steps});
  return {shape_size(fn, {batch, hidden}), shape_size(fn, {steps, batch, hidden}),
          shape_size(fn, {steps, batch, 4, hidden}), shape_size(fn, {hidden, 4, hidden})};
}

template <class A>
void check_lstm_layer_fwd(const char* fn, const A& xw, const A& h0, const A& c0, const A& w_hh,
                          idx_t batch, idx_t hidden, idx_t steps, const A& out, const A& h,
                          const A& c, const A& act) {
  const LstmLayerSizes n = lstm_layer_sizes(fn, batch, hidden, steps);
  check_size(fn, "xw", xw.size, n.gates);
  check_size(fn, "h0", h0.size, n.state);
  check_size(fn, "c0", c0.size, n.state);
  check_size(fn, "w_hh", w_hh.size, n.w);
  check_size(fn, "out", out.size, n.seq);
  check_size(fn, "h", h.size, n.state);
  check_size(fn, "c", c.size, n.state);
  check_size(fn, "act", act.size, n.gates);
}

template <class A>
void check_lstm_layer_bwd(const char* fn, const A& d_out, const A& dh, const A& dc, const A& act,
                          const A& out, const A& h0, const A& c0, const A& w_hh,
                          idx_t batch, idx_t hidden, idx_t steps, const A& dxw, const A& dh0,
                          const A& dc0, const A& dw_hh) {
  const LstmLayerSizes n = lstm_layer_sizes(fn, batch, hidden, steps);
  check_size(fn, "d_out", d_out.size, n.seq);
  check_size(fn, "dh", dh.size, n.state);
  check_size(fn, "dc", dc.size, n.state);
  check_size(fn, "act", act.size, n.gates);
  check_size(fn, "out", out.size, n.seq);
  check_size(fn, "h0", h0.size, n.state);
  check_size(fn, "c0", c0.size, n.state);
  check_size(fn, "w_hh", w_hh.size, n.w);
  check_size(fn, "dxw", dxw.size, n.gates);
  check_size(fn, "dh0", dh0.size, n.state);
  check_size(fn, "dc0", dc0.size, n.state);
  check_size(fn, "dw_hh", dw_hh.size, n.w);
}

// ---- the embedding kernels: ids are float32 holding whole numbers in [0, vocab) -----------------
template <class A>
void check_embedding_gather(const char* fn, const A& weight, const A& ids, idx_t vocab,
                            idx_t cols, idx_t rows, const A& out) {
  check_sizes(fn, {vocab, cols, rows});
  check_size(fn, "weight", weight.size, shape_size(fn, {vocab, cols}));
  check_size(fn, "ids", ids.size, rows);
  check_size(fn, "out", out.size, shape_size(fn, {rows, cols}));
}

template <class A>
void check_embedding_scatter_add(const char* fn, const A& grad, const A& ids, idx_t rows,
                                 idx_t cols, idx_t vocab, const A& out) {
  check_sizes(fn, {rows, cols, vocab});
  check_size(fn, "grad", grad.size, shape_size(fn, {rows, cols}));
  check_size(fn, "ids", ids.size, rows);
  check_size(fn, "out", out.size, shape_size(fn, {vocab, cols}));
}

// True when `id` is a whole number in [0, vocab) (compared in double: vocab < 2^50 is exact).
inline bool is_id(float id, idx_t vocab) {
  return id >= 0.0f && double(id) < double(vocab) && id == std::floor(id);
}

// An id that is not a whole number in [0, vocab): std::out_of_range, which pybind11 raises as
// IndexError (an id is a subscript of the table), naming the id and its position.
[[noreturn]] inline void fail_id(const std::string& fn, float id, idx_t position, idx_t vocab) {
  std::ostringstream s;
  s << fn << ": ids must be whole numbers (integers) in [0, " << vocab << "), got " << id
    << " at position " << position;
  throw std::out_of_range(s.str());
}

// Checks the `rows` ids at `ids` (host memory) with is_id; fail_id for the first that fails.
inline void check_ids(const std::string& fn, const float* ids, idx_t rows, idx_t vocab) {
  for (idx_t r = 0; r < rows; ++r)
    if (!is_id(ids[r], vocab)) fail_id(fn, ids[r], r, vocab);
}

}  // namespace needle::checks
