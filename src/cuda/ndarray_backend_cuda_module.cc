// pybind11 bindings of needle's CUDA device module (`ndarray_backend_cuda`), implementing the
// device protocol of needle/backend_ndarray/protocol.py.
//
// This is the Python/C++ border: every buffer size, shape, stride, offset and op code is
// validated here with the checks shared with the CPU module (src/common/ndarray_checks.h: a wrong
// value raises ValueError naming the function and the numbers) before the kernels in
// ndarray_backend_cuda.cu run. CUDA failures arrive as std::runtime_error -> RuntimeError, a
// failed allocation as MemoryError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/ndarray_backend_cuda.h"
#include "common/ndarray_attention.h"
#include "common/ndarray_bindings.h"
#include "common/ndarray_checks.h"
#include "common/ndarray_ops.h"

namespace py = pybind11;

namespace {

using needle::cuda::CudaArray;
using needle::cuda::MatrixView;
using needle::cuda::Strided;
using needle::checks::check_at_least;
using needle::checks::check_batchnorm_fwd;
using needle::checks::check_embedding_gather;
using needle::checks::check_embedding_scatter_add;
using needle::checks::check_lstm_cell_bwd;
using needle::checks::check_lstm_cell_fwd;
using needle::checks::check_lstm_layer_bwd;
using needle::checks::check_lstm_layer_fwd;
using needle::checks::check_norm_bwd;
using needle::checks::check_norm_fwd;
using needle::checks::check_op;
using needle::checks::check_size;
using needle::checks::check_sizes;
using needle::checks::check_softmax_xent;
using needle::checks::check_softmax_xent_bwd;
using needle::checks::check_view;
using needle::checks::fail;
using needle::checks::idx_t;
using needle::checks::shape_size;
using needle::checks::tuple_str;
using Ints = std::vector<idx_t>;

constexpr int kBinaryCount = static_cast<int>(needle::ops::BinaryOp::count);
constexpr int kUnaryCount = static_cast<int>(needle::ops::UnaryOp::count);
constexpr int kReduceCount = static_cast<int>(needle::ops::ReduceOp::count);
// Matrix sizes stay below this so that tile indices never overflow int32 in the kernel.
constexpr idx_t kMaxMatmulDim = (idx_t{1} << 31) - 1024;

// One strided operand of an iteration: its strides and offset.
struct Operand {
  const Ints& strides;
  idx_t offset;
};

// The iteration over `shape` (whose operands' views the caller has checked) in kernel form:
// size-1 dimensions dropped and neighbours merged where every operand steps over the inner one
// exactly, so kernels divide less and compact operands become one unit-stride run.
Strided iteration(const std::string& fn, const Ints& shape, std::initializer_list<Operand> ops) {
  Strided d;
  d.size = shape_size(fn, shape);
  int k = 0;
  for (const Operand& op : ops) d.offset[k++] = op.offset;
  if (d.size == 0) return d;
  for (size_t dim = 0; dim < shape.size(); ++dim) {
    if (shape[dim] == 1) continue;
    bool merge = d.ndim > 0;
    k = 0;
    for (const Operand& op : ops) {
      merge = merge && d.strides[k][d.ndim - 1] == op.strides[dim] * shape[dim];
      ++k;
    }
    if (!merge && d.ndim == needle::cuda::MAX_DIMS) {
      fail(fn, "shape " + tuple_str(shape) + " needs more than " +
                   std::to_string(needle::cuda::MAX_DIMS) +
                   " dimensions after merging contiguous ones; the CUDA module supports " +
                   std::to_string(needle::cuda::MAX_DIMS));
    }
    if (!merge) d.shape[d.ndim++] = 1;
    d.shape[d.ndim - 1] *= shape[dim];
    k = 0;
    for (const Operand& op : ops) d.strides[k++][d.ndim - 1] = op.strides[dim];
  }
  return d;
}

// n elements of compact buffers.
Strided flat(idx_t n) {
  static const Ints unit{1};
  return iteration("flat", Ints{n}, {Operand{unit, 0}, Operand{unit, 0}});
}

// A compact (rows, len) matrix as the outer and inner parts of a row reduction.
std::pair<Strided, Strided> rows_of(idx_t rows, idx_t len) {
  const Ints outer_strides{len}, inner_strides{1};
  return {iteration("reduce", Ints{rows}, {Operand{outer_strides, 0}}),
          iteration("reduce", Ints{len}, {Operand{inner_strides, 0}})};
}

int binary_code(const char* name) {
  for (int i = 0; i < kBinaryCount; ++i)
    if (std::strcmp(needle::ops::kBinaryOpNames[i], name) == 0) return i;
  throw std::logic_error(std::string("no binary op named ") + name);
}

int unary_code(const char* name) {
  for (int i = 0; i < kUnaryCount; ++i)
    if (std::strcmp(needle::ops::kUnaryOpNames[i], name) == 0) return i;
  throw std::logic_error(std::string("no unary op named ") + name);
}

template <size_t N>
py::tuple names(const char* const (&table)[N]) {
  py::tuple t(N);
  for (size_t i = 0; i < N; ++i) t[i] = py::str(table[i]);
  return t;
}

// ---- memory ---------------------------------------------------------------------------------
py::array_t<float> to_numpy(const CudaArray& a, const Ints& shape, const Ints& strides,
                            idx_t offset) {
  check_view("to_numpy", shape, strides, offset, a.size);
  const Strided v = iteration("to_numpy", shape, {Operand{strides, offset}});
  py::array_t<float> result(std::vector<py::ssize_t>(shape.begin(), shape.end()));
  float* dst = result.mutable_data();
  py::gil_scoped_release release;
  needle::cuda::to_host(a, v, dst);
  return result;
}

void from_numpy(py::array_t<float, py::array::c_style | py::array::forcecast> a, CudaArray& out) {
  check_size("from_numpy", "the numpy array", static_cast<idx_t>(a.size()), out.size);
  const float* src = a.data();
  py::gil_scoped_release release;
  needle::cuda::from_host(src, &out);
}

void compact(const CudaArray& a, CudaArray& out, const Ints& shape, const Ints& strides,
             idx_t offset) {
  const idx_t n = check_view("compact", shape, strides, offset, a.size);
  check_size("compact", "out", out.size, n);
  needle::cuda::compact(a, &out, iteration("compact", shape, {Operand{strides, offset}}));
}

void ewise_setitem(const CudaArray& a, CudaArray& out, const Ints& shape, const Ints& strides,
                   idx_t offset) {
  const idx_t n = check_view("ewise_setitem", shape, strides, offset, out.size);
  check_size("ewise_setitem", "a", a.size, n);
  needle::cuda::ewise_setitem(a, &out, iteration("ewise_setitem", shape, {Operand{strides, offset}}));
}

void scalar_setitem(idx_t size, float val, CudaArray& out, const Ints& shape, const Ints& strides,
                    idx_t offset) {
  const idx_t n = check_view("scalar_setitem", shape, strides, offset, out.size);
  if (size != n) {
    fail("scalar_setitem", "size " + std::to_string(size) + " does not match shape " +
                               tuple_str(shape) + " (" + std::to_string(n) + " elements)");
  }
  needle::cuda::scalar_setitem(val, &out,
                               iteration("scalar_setitem", shape, {Operand{strides, offset}}));
}

// ---- element-wise ---------------------------------------------------------------------------
void ewise_binary(int op, const CudaArray& a, const Ints& a_strides, idx_t a_offset,
                  const CudaArray& b, const Ints& b_strides, idx_t b_offset, CudaArray& out,
                  const Ints& shape) {
  check_op("ewise_binary", op, kBinaryCount);
  const idx_t n = check_view("ewise_binary (a)", shape, a_strides, a_offset, a.size);
  check_view("ewise_binary (b)", shape, b_strides, b_offset, b.size);
  check_size("ewise_binary", "out", out.size, n);
  needle::cuda::ewise_binary(
      op, a, b, &out,
      iteration("ewise_binary", shape, {Operand{a_strides, a_offset}, Operand{b_strides, b_offset}}));
}

void ewise_scalar(int op, const CudaArray& a, const Ints& a_strides, idx_t a_offset, float val,
                  CudaArray& out, const Ints& shape, bool reverse) {
  check_op("ewise_scalar", op, kBinaryCount);
  const idx_t n = check_view("ewise_scalar", shape, a_strides, a_offset, a.size);
  check_size("ewise_scalar", "out", out.size, n);
  needle::cuda::ewise_scalar(op, a, val, reverse, &out,
                             iteration("ewise_scalar", shape, {Operand{a_strides, a_offset}}));
}

void ewise_unary(int op, const CudaArray& a, const Ints& a_strides, idx_t a_offset,
                 CudaArray& out, const Ints& shape) {
  check_op("ewise_unary", op, kUnaryCount);
  const idx_t n = check_view("ewise_unary", shape, a_strides, a_offset, a.size);
  check_size("ewise_unary", "out", out.size, n);
  needle::cuda::ewise_unary(op, a, &out,
                            iteration("ewise_unary", shape, {Operand{a_strides, a_offset}}));
}

// The course's compact forms: ewise_<name>(a, b, out), scalar_<name>(a, val, out),
// ewise_<unary>(a, out), all over out.size elements.
void bind_course_binary(py::module_& m, const char* name, bool with_ewise) {
  const int op = binary_code(name);
  const std::string ewise = std::string("ewise_") + name, scalar = std::string("scalar_") + name;
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  if (with_ewise) {
    m.def(
        ewise.c_str(),
        [op, ewise](const CudaArray& a, const CudaArray& b, CudaArray& out) {
          check_size(ewise, "a", a.size, out.size);
          check_size(ewise, "b", b.size, out.size);
          needle::cuda::ewise_binary(op, a, b, &out, flat(out.size));
        },
        py::arg("a"), py::arg("b"), py::arg("out"), nogil,
        ("out[i] = " + std::string(name) + "(a[i], b[i]) over compact buffers of one size.").c_str());
  }
  m.def(
      scalar.c_str(),
      [op, scalar](const CudaArray& a, float val, CudaArray& out) {
        check_size(scalar, "a", a.size, out.size);
        needle::cuda::ewise_scalar(op, a, val, false, &out, flat(out.size));
      },
      py::arg("a"), py::arg("val"), py::arg("out"), nogil,
      ("out[i] = " + std::string(name) + "(a[i], val) over compact buffers of one size.").c_str());
}

void bind_course_unary(py::module_& m, const char* name) {
  const int op = unary_code(name);
  const std::string fn = std::string("ewise_") + name;
  m.def(
      fn.c_str(),
      [op, fn](const CudaArray& a, CudaArray& out) {
        check_size(fn, "a", a.size, out.size);
        needle::cuda::ewise_unary(op, a, &out, flat(out.size));
      },
      py::arg("a"), py::arg("out"), py::call_guard<py::gil_scoped_release>(),
      ("out[i] = " + std::string(name) + "(a[i]) over compact buffers of one size.").c_str());
}

// ---- reductions -----------------------------------------------------------------------------
void reduce(int op, const CudaArray& a, const Ints& shape, const Ints& strides, idx_t offset,
            idx_t keep, CudaArray& out) {
  check_op("reduce", op, kReduceCount);
  check_view("reduce", shape, strides, offset, a.size);
  if (keep < 0 || keep > static_cast<idx_t>(shape.size())) {
    fail("reduce", "keep " + std::to_string(keep) + " is outside [0, " +
                       std::to_string(shape.size()) + "] for shape " + tuple_str(shape));
  }
  const Ints outer_shape(shape.begin(), shape.begin() + keep), inner_shape(shape.begin() + keep, shape.end());
  const Ints outer_strides(strides.begin(), strides.begin() + keep),
      inner_strides(strides.begin() + keep, strides.end());
  const idx_t outputs = shape_size("reduce", outer_shape);
  check_size("reduce", "out", out.size, outputs);
  if (outputs == 0) return;
  if (shape_size("reduce", inner_shape) == 0) {
    if (op == static_cast<int>(needle::ops::ReduceOp::max)) {
      fail("reduce", "max over an empty extent " + tuple_str(inner_shape) + " of shape " +
                         tuple_str(shape) + " has no identity");
    }
    needle::cuda::fill(&out, 0.0f);  // an empty sum
    return;
  }
  needle::cuda::reduce(op, a, iteration("reduce", outer_shape, {Operand{outer_strides, offset}}),
                       iteration("reduce", inner_shape, {Operand{inner_strides, 0}}), &out);
}

// The course's reduce_sum / reduce_max: out[j] = op of compact a[j*rs : (j+1)*rs].
void reduce_rows(const char* fn, needle::ops::ReduceOp op, const CudaArray& a, CudaArray& out,
                 idx_t reduce_size) {
  if (reduce_size <= 0)
    fail(fn, "reduce_size must be positive, got " + std::to_string(reduce_size));
  if (static_cast<__int128>(out.size) * reduce_size > a.size) {
    std::ostringstream s;
    s << "out has " << out.size << " elements, reducing " << reduce_size << " each needs more "
      << "than the " << a.size << " elements of a";
    fail(fn, s.str());
  }
  const auto parts = rows_of(out.size, reduce_size);
  needle::cuda::reduce(static_cast<int>(op), a, parts.first, parts.second, &out);
}

// ---- matrix products ------------------------------------------------------------------------
void check_matmul_sizes(const char* fn, idx_t m, idx_t n, idx_t p) {
  check_sizes(fn, {m, n, p});
  if (m > kMaxMatmulDim || n > kMaxMatmulDim || p > kMaxMatmulDim) {
    fail(fn, "sizes m=" + std::to_string(m) + ", n=" + std::to_string(n) + ", p=" +
                 std::to_string(p) + " exceed the CUDA module's limit " +
                 std::to_string(kMaxMatmulDim));
  }
}

void matmul(const CudaArray& a, const CudaArray& b, CudaArray& out, idx_t m, idx_t n, idx_t p) {
  check_matmul_sizes("matmul", m, n, p);
  check_at_least("matmul", "a", a.size, shape_size("matmul", {m, n}));
  check_at_least("matmul", "b", b.size, shape_size("matmul", {n, p}));
  check_at_least("matmul", "out", out.size, shape_size("matmul", {m, p}));
  needle::cuda::matmul(a, MatrixView{0, 0, n, 1}, b, MatrixView{0, 0, p, 1}, &out, 1, m, n, p);
}

// out (compact, batch + (m, p)) = A[k] @ B[k] over the batch dimensions `batch` (see
// common/ndarray_attention.h): each operand has one stride per batch dimension, then row and
// column.
void matmul_strided(const CudaArray& a, const Ints& a_strides, idx_t a_offset, const CudaArray& b,
                    const Ints& b_strides, idx_t b_offset, CudaArray& out, const Ints& batch,
                    idx_t m, idx_t n, idx_t p) {
  const char* fn = "matmul_strided";
  check_matmul_sizes(fn, m, n, p);
  needle::batch::check(fn, batch, a_strides, b_strides);
  Ints a_shape = batch, b_shape = batch, out_shape = batch;
  a_shape.insert(a_shape.end(), {m, n});
  b_shape.insert(b_shape.end(), {n, p});
  out_shape.insert(out_shape.end(), {m, p});
  check_view(std::string(fn) + " (a)", a_shape, a_strides, a_offset, a.size);
  check_view(std::string(fn) + " (b)", b_shape, b_strides, b_offset, b.size);
  const idx_t size = shape_size(fn, out_shape);
  check_size(fn, "out", out.size, size);
  if (size == 0) return;
  const size_t nb = batch.size();
  std::vector<needle::cuda::MatmulGroup> groups;
  needle::batch::for_each_group(
      needle::batch::collapse(batch, Ints(a_strides.begin(), a_strides.end() - 2),
                              Ints(b_strides.begin(), b_strides.end() - 2)),
      [&](const needle::batch::Group& g) {
        groups.push_back({MatrixView{a_offset + g.a, g.outer.a, a_strides[nb], a_strides[nb + 1],
                                     g.inner.size, g.inner.a},
                          MatrixView{b_offset + g.b, g.outer.b, b_strides[nb], b_strides[nb + 1],
                                     g.inner.size, g.inner.b},
                          g.first, g.outer.size * g.inner.size});
      });
  needle::cuda::matmul(a, b, &out, groups, m, n, p);
}

void matmul_tiled(const CudaArray& a, const CudaArray& b, CudaArray& out, idx_t m, idx_t n,
                  idx_t p) {
  check_matmul_sizes("matmul_tiled", m, n, p);
  constexpr idx_t T = needle::cuda::TILE;
  if (m % T || n % T || p % T) {
    fail("matmul_tiled", "m=" + std::to_string(m) + ", n=" + std::to_string(n) + ", p=" +
                             std::to_string(p) + " must be multiples of the tile size " +
                             std::to_string(T));
  }
  check_at_least("matmul_tiled", "a", a.size, shape_size("matmul_tiled", {m, n}));
  check_at_least("matmul_tiled", "b", b.size, shape_size("matmul_tiled", {n, p}));
  check_at_least("matmul_tiled", "out", out.size, shape_size("matmul_tiled", {m, p}));
  needle::cuda::matmul_tiled(a, b, &out, m, n, p);
}

// ---- fused kernels --------------------------------------------------------------------------
// The ValueError for row `bad` of `labels`, whose label is not an integer in [0, cols).
[[noreturn]] void fail_label(const char* fn, const CudaArray& labels, idx_t bad, idx_t cols) {
  Strided one;
  one.offset[0] = bad;
  float label = 0.0f;
  needle::cuda::to_host(labels, one, &label);
  std::ostringstream s;
  s << "label " << label << " of row " << bad << " is not an integer in [0, " << cols << ")";
  fail(fn, s.str());
}

void softmax_xent(const CudaArray& logits, const CudaArray& labels, idx_t rows, idx_t cols,
                  CudaArray& loss, CudaArray& probs) {
  const char* fn = "softmax_xent";
  check_softmax_xent(fn, logits, labels, rows, cols, loss, probs);
  const idx_t bad = needle::cuda::softmax_xent(logits, labels, rows, cols, &loss, &probs);
  if (bad >= 0) fail_label(fn, labels, bad, cols);
}

void softmax_xent_bwd(const CudaArray& probs, const CudaArray& labels, const CudaArray& dloss,
                      idx_t rows, idx_t cols, float scale, CudaArray& dlogits) {
  const char* fn = "softmax_xent_bwd";
  check_softmax_xent_bwd(fn, probs, labels, dloss, rows, cols, dlogits);
  const idx_t bad =
      needle::cuda::softmax_xent_bwd(probs, labels, dloss, rows, cols, scale, &dlogits);
  if (bad >= 0) fail_label(fn, labels, bad, cols);
}

void layernorm_fwd(const CudaArray& x, const CudaArray& w, const CudaArray& b, idx_t rows,
                   idx_t cols, float eps, CudaArray& y, CudaArray& xhat, CudaArray& rstd) {
  check_norm_fwd("layernorm_fwd", x, w, b, rows, cols, rows, y, xhat, rstd);
  needle::cuda::layernorm_fwd(x, w, b, rows, cols, eps, &y, &xhat, &rstd);
}

void layernorm_bwd(const CudaArray& dy, const CudaArray& xhat, const CudaArray& rstd,
                   const CudaArray& w, idx_t rows, idx_t cols, CudaArray& dx, CudaArray& dw,
                   CudaArray& db) {
  check_norm_bwd("layernorm_bwd", dy, xhat, rstd, w, rows, cols, rows, dx, dw, db);
  needle::cuda::layernorm_bwd(dy, xhat, rstd, w, rows, cols, &dx, &dw, &db);
}

void batchnorm_fwd(const CudaArray& x, const CudaArray& w, const CudaArray& b, idx_t rows,
                   idx_t cols, float eps, CudaArray& y, CudaArray& xhat, CudaArray& rstd,
                   CudaArray& mean, CudaArray& var) {
  check_batchnorm_fwd("batchnorm_fwd", x, w, b, rows, cols, y, xhat, rstd, mean, var);
  needle::cuda::batchnorm_fwd(x, w, b, rows, cols, eps, &y, &xhat, &rstd, &mean, &var);
}

void batchnorm_bwd(const CudaArray& dy, const CudaArray& xhat, const CudaArray& rstd,
                   const CudaArray& w, idx_t rows, idx_t cols, CudaArray& dx, CudaArray& dw,
                   CudaArray& db) {
  check_norm_bwd("batchnorm_bwd", dy, xhat, rstd, w, rows, cols, cols, dx, dw, db);
  needle::cuda::batchnorm_bwd(dy, xhat, rstd, w, rows, cols, &dx, &dw, &db);
}

void lstm_cell_fwd(const CudaArray& gates, const CudaArray& c_prev, idx_t batch, idx_t hidden,
                   CudaArray& h, CudaArray& c, CudaArray& act, CudaArray& tanh_c) {
  check_lstm_cell_fwd("lstm_cell_fwd", gates, c_prev, batch, hidden, h, c, act, tanh_c);
  needle::cuda::lstm_cell_fwd(gates, c_prev, batch, hidden, &h, &c, &act, &tanh_c);
}

void lstm_cell_bwd(const CudaArray& dh, const CudaArray& dc, const CudaArray& act,
                   const CudaArray& c_prev, const CudaArray& tanh_c, idx_t batch, idx_t hidden,
                   CudaArray& dgates, CudaArray& dc_prev) {
  check_lstm_cell_bwd("lstm_cell_bwd", dh, dc, act, c_prev, tanh_c, batch, hidden, dgates,
                      dc_prev);
  needle::cuda::lstm_cell_bwd(dh, dc, act, c_prev, tanh_c, batch, hidden, &dgates, &dc_prev);
}

// The layer's products, (batch x hidden) @ (hidden x 4·hidden), (batch x 4·hidden) @ (4·hidden x
// hidden) and (hidden x steps·batch) @ (steps·batch x 4·hidden), within the matmul's int range.
void check_lstm_layer_products(const char* fn, idx_t batch, idx_t hidden, idx_t steps) {
  const idx_t n = shape_size(fn, {steps, batch});
  check_matmul_sizes(fn, batch, hidden, shape_size(fn, {4, hidden}));
  check_matmul_sizes(fn, hidden, n, 4 * hidden);
}

void lstm_layer_fwd(const CudaArray& xw, const CudaArray& h0, const CudaArray& c0,
                    const CudaArray& w_hh, idx_t batch, idx_t hidden, idx_t steps, CudaArray& out,
                    CudaArray& h, CudaArray& c, CudaArray& act) {
  const char* fn = "lstm_layer_fwd";
  check_lstm_layer_fwd(fn, xw, h0, c0, w_hh, batch, hidden, steps, out, h, c, act);
  check_lstm_layer_products(fn, batch, hidden, steps);
  needle::cuda::lstm_layer_fwd(xw, h0, c0, w_hh, batch, hidden, steps, &out, &h, &c, &act);
}

void lstm_layer_bwd(const CudaArray& d_out, const CudaArray& dh, const CudaArray& dc,
                    const CudaArray& act, const CudaArray& out, const CudaArray& h0,
                    const CudaArray& c0, const CudaArray& w_hh, idx_t batch, idx_t hidden,
                    idx_t steps, CudaArray& dxw, CudaArray& dh0, CudaArray& dc0,
                    CudaArray& dw_hh) {
  const char* fn = "lstm_layer_bwd";
  check_lstm_layer_bwd(fn, d_out, dh, dc, act, out, h0, c0, w_hh, batch, hidden, steps, dxw, dh0,
                       dc0, dw_hh);
  check_lstm_layer_products(fn, batch, hidden, steps);
  needle::cuda::lstm_layer_bwd(d_out, dh, dc, act, out, h0, c0, w_hh, batch, hidden, steps, &dxw,
                               &dh0, &dc0, &dw_hh);
}

void sgd_update(CudaArray& param, const CudaArray& grad, CudaArray& buf, float lr,
                float momentum, float weight_decay) {
  check_size("sgd_update", "grad", grad.size, param.size);
  check_size("sgd_update", "buf", buf.size, param.size);
  needle::cuda::sgd_update(&param, grad, &buf, lr, momentum, weight_decay);
}

void adam_update(CudaArray& param, const CudaArray& grad, CudaArray& m, CudaArray& v, float lr,
                 float beta1, float beta2, float eps, float weight_decay, idx_t step) {
  const char* fn = "adam_update";
  if (step < 1) fail(fn, "step must be at least 1, got " + std::to_string(step));
  check_size(fn, "grad", grad.size, param.size);
  check_size(fn, "m", m.size, param.size);
  check_size(fn, "v", v.size, param.size);
  const double steps = static_cast<double>(step);
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), steps));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), steps));
  needle::cuda::adam_update(&param, grad, &m, &v, lr, beta1, beta2, eps, weight_decay, bc1, bc2);
}

// IndexError (needle::checks::fail_id) for the bad id at position `bad` of ids, if bad >= 0.
void raise_bad_id(const char* fn, const CudaArray& ids, idx_t bad, idx_t vocab) {
  if (bad < 0) return;
  Strided one;
  one.offset[0] = bad;
  float id = 0.0f;
  needle::cuda::to_host(ids, one, &id);
  needle::checks::fail_id(fn, id, bad, vocab);
}

void softmax_fwd(const CudaArray& x, idx_t rows, idx_t cols, double scale, idx_t queries,
                 CudaArray& y) {
  needle::checks::check_softmax_fwd("softmax_fwd", x, rows, cols, queries, y);
  needle::cuda::softmax_fwd(x, rows, cols, static_cast<float>(scale), queries, &y);
}

void softmax_bwd(const CudaArray& y, const CudaArray& dy, idx_t rows, idx_t cols, double scale,
                 CudaArray& dx) {
  needle::checks::check_softmax_bwd("softmax_bwd", y, dy, rows, cols, dx);
  needle::cuda::softmax_bwd(y, dy, rows, cols, static_cast<float>(scale), &dx);
}

// A compact iteration over n elements (every operand contiguous from 0).
Strided contiguous(idx_t n) {
  Strided v;
  v.ndim = 1;
  v.size = n;
  v.shape[0] = n;
  v.strides[0][0] = v.strides[1][0] = 1;
  return v;
}

// attention_fwd on the GPU: the batched product q kᵀ into a logits buffer, softmax_fwd's
// kernel, the batched product with v (the kernels the separate ops run, in one call).
void attention_fwd(const CudaArray& q, const CudaArray& k, const CudaArray& v, idx_t heads,
                   idx_t queries, idx_t dim, idx_t keys, double scale, idx_t causal,
                   CudaArray& out, CudaArray& probs) {
  needle::checks::check_attention_fwd("attention_fwd", q, k, v, heads, queries, dim, keys, causal,
                                      out, probs);
  check_matmul_sizes("attention_fwd", queries, dim, keys);
  if (heads * queries == 0) return;
  if (keys == 0) return needle::cuda::fill(&out, 0.0f);  // no key: a sum of nothing
  CudaArray logits(heads * queries * keys);
  if (dim == 0) {
    needle::cuda::fill(&logits, 0.0f);
  } else {
    needle::cuda::matmul(q, MatrixView{0, queries * dim, dim, 1}, k,
                         MatrixView{0, keys * dim, 1, dim}, &logits, heads, queries, dim, keys);
  }
  needle::cuda::softmax_fwd(logits, heads * queries, keys, static_cast<float>(scale),
                            causal ? queries : 0, &probs);
  if (dim == 0) return;
  needle::cuda::matmul(probs, MatrixView{0, queries * keys, keys, 1}, v,
                       MatrixView{0, keys * dim, dim, 1}, &out, heads, queries, keys, dim);
}

// attention_bwd on the GPU: dp = d_out vᵀ + d_probs, softmax_bwd's kernel, then dq = ds k,
// dk = dsᵀ q and dv = probsᵀ d_out as batched products.
void attention_bwd(const CudaArray& d_out, const CudaArray& d_probs, const CudaArray& probs,
                   const CudaArray& q, const CudaArray& k, const CudaArray& v, idx_t heads,
                   idx_t queries, idx_t dim, idx_t keys, double scale, CudaArray& dq,
                   CudaArray& dk, CudaArray& dv) {
  needle::checks::check_attention_bwd("attention_bwd", d_out, d_probs, probs, q, k, v, heads,
                                      queries, dim, keys, dq, dk, dv);
  check_matmul_sizes("attention_bwd", queries, dim, keys);
  const idx_t n = heads * queries * keys;
  if (dim == 0) return;  // dq, dk, dv have no element
  if (n == 0) {  // no query or no key: every product is a sum of nothing
    if (dq.size) needle::cuda::fill(&dq, 0.0f);
    if (dk.size) needle::cuda::fill(&dk, 0.0f);
    if (dv.size) needle::cuda::fill(&dv, 0.0f);
    return;
  }
  CudaArray dp(n), ds(n);
  needle::cuda::matmul(d_out, MatrixView{0, queries * dim, dim, 1}, v,
                       MatrixView{0, keys * dim, 1, dim}, &dp, heads, queries, dim, keys);
  needle::cuda::ewise_binary(static_cast<int>(needle::ops::BinaryOp::add), dp, d_probs, &dp,
                             contiguous(n));
  needle::cuda::softmax_bwd(probs, dp, heads * queries, keys, static_cast<float>(scale), &ds);
  needle::cuda::matmul(ds, MatrixView{0, queries * keys, keys, 1}, k,
                       MatrixView{0, keys * dim, dim, 1}, &dq, heads, queries, keys, dim);
  needle::cuda::matmul(ds, MatrixView{0, queries * keys, 1, keys}, q,
                       MatrixView{0, queries * dim, dim, 1}, &dk, heads, keys, queries, dim);
  needle::cuda::matmul(probs, MatrixView{0, queries * keys, 1, keys}, d_out,
                       MatrixView{0, queries * dim, dim, 1}, &dv, heads, keys, queries, dim);
}

void embedding_gather(const CudaArray& weight, const CudaArray& ids, idx_t vocab, idx_t cols,
                      idx_t rows, CudaArray& out) {
  const char* fn = "embedding_gather";
  check_embedding_gather(fn, weight, ids, vocab, cols, rows, out);
  raise_bad_id(fn, ids, needle::cuda::embedding_gather(weight, ids, vocab, cols, rows, &out),
               vocab);
}

void embedding_scatter_add(const CudaArray& grad, const CudaArray& ids, idx_t rows, idx_t cols,
                           idx_t vocab, CudaArray& out) {
  const char* fn = "embedding_scatter_add";
  check_embedding_scatter_add(fn, grad, ids, rows, cols, vocab, out);
  raise_bad_id(fn, ids, needle::cuda::embedding_scatter_add(grad, ids, rows, cols, vocab, &out),
               vocab);
}

// The convolutions: checks (shared with the CPU module), the matmul engine's int range, then the
// launch.
needle::checks::ConvGeometry conv_checked(const char* fn, const needle::checks::ConvGeometry& g) {
  check_matmul_sizes(fn, g.rows(), g.depth(), g.cout);
  return g;
}

void conv_fwd(const CudaArray& x, const CudaArray& weight, idx_t n, idx_t h, idx_t w, idx_t c_in,
              idx_t kh, idx_t kw, idx_t c_out, idx_t stride, idx_t padding, CudaArray& out) {
  const char* fn = "conv_fwd";
  needle::cuda::conv_fwd(x, weight,
                         conv_checked(fn, needle::checks::check_conv_fwd(fn, x, weight, n, h, w,
                                                                         c_in, kh, kw, c_out,
                                                                         stride, padding, out)),
                         &out);
}

void conv_input_grad(const CudaArray& grad, const CudaArray& weight, idx_t kh, idx_t kw,
                     idx_t c_in, idx_t c_out, idx_t n, idx_t h, idx_t w, idx_t stride,
                     idx_t padding, CudaArray& out) {
  const char* fn = "conv_input_grad";
  needle::cuda::conv_input_grad(
      grad, weight,
      conv_checked(fn, needle::checks::check_conv_input_grad(fn, grad, weight, kh, kw, c_in,
                                                             c_out, n, h, w, stride, padding,
                                                             out)),
      &out);
}

void conv_weight_grad(const CudaArray& x, const CudaArray& grad, idx_t n, idx_t h, idx_t w,
                      idx_t c_in, idx_t kh, idx_t kw, idx_t c_out, idx_t stride, idx_t padding,
                      CudaArray& out) {
  const char* fn = "conv_weight_grad";
  needle::cuda::conv_weight_grad(
      x, grad,
      conv_checked(fn, needle::checks::check_conv_weight_grad(fn, x, grad, n, h, w, c_in, kh, kw,
                                                              c_out, stride, padding, out)),
      &out);
}

}  // namespace

PYBIND11_MODULE(ndarray_backend_cuda, m) {
  m.doc() = R"doc(needle's CUDA device module: float32 buffers in GPU memory and the kernels of
the device protocol (needle/backend_ndarray/protocol.py).

Every function validates its arguments first (ValueError for sizes that disagree, a view that
leaves its buffer, an unknown op code; the same checks as the CPU module) and raises
RuntimeError when no GPU is usable or CUDA fails, MemoryError when device memory runs out.
Kernels are queued asynchronously; to_numpy and synchronize() wait for them.)doc";
  m.attr("__device_name__") = "cuda";
  m.attr("__tile_size__") = needle::cuda::TILE;
  m.attr("__binary_ops__") = names(needle::ops::kBinaryOpNames);
  m.attr("__unary_ops__") = names(needle::ops::kUnaryOpNames);
  m.attr("__reduce_ops__") = names(needle::ops::kReduceOpNames);
  py::register_exception<needle::cuda::OutOfMemory>(m, "OutOfMemory", PyExc_MemoryError);
  const auto nogil = py::call_guard<py::gil_scoped_release>();

  py::class_<CudaArray>(m, "Array", "A flat float32 buffer of `size` elements in GPU memory.")
      .def(py::init([](idx_t size) {
             if (size < 0) fail("Array", "size must be non-negative, got " + std::to_string(size));
             if (size > needle::checks::kMaxElements)
               fail("Array", "size " + std::to_string(size) + " is too large");
             return new CudaArray(size);
           }),
           py::arg("size"))
      .def_readonly("size", &CudaArray::size, "Number of float32 elements.")
      .def(
          "ptr", [](const CudaArray& a) { return reinterpret_cast<std::uintptr_t>(a.ptr); },
          "Device address of the first element (views of one buffer share it; 0 when empty).");

  m.def("is_available", &needle::cuda::is_available,
        "True when the CUDA runtime sees at least one GPU (cudaGetDeviceCount).");
  m.def(
      "memory_stats",
      [] {
        py::dict d;
        d["live_bytes"] = needle::cuda::live_bytes();
        d["peak_bytes"] = needle::cuda::peak_bytes();
        return d;
      },
      "Bytes held by live Arrays (live_bytes) and their peak since reset_peak().");
  m.def("reset_peak", &needle::cuda::reset_peak,
        "Restart the peak of memory_stats() from the bytes live now.");
  m.def("device_count", &needle::cuda::device_count,
        "Number of visible CUDA devices (0 when there is no GPU or driver).");
  m.def("synchronize", &needle::cuda::synchronize, nogil,
        "Wait for every queued kernel to finish (for timing); raises on an asynchronous error.");

  m.def("to_numpy", &to_numpy, py::arg("a"), py::arg("shape"), py::arg("strides"),
        py::arg("offset"), "A new numpy float32 array of `shape` holding the view of `a`.");
  m.def("from_numpy", &from_numpy, py::arg("a"), py::arg("out"),
        "Copy the elements of `a` (row-major, as float32) into `out` (same size).");
  m.def(
      "fill", [](CudaArray& out, float val) { needle::cuda::fill(&out, val); }, py::arg("out"),
      py::arg("val"), nogil,
        "Set every element of `out` to `val`.");
  m.def("compact", &compact, py::arg("a"), py::arg("out"), py::arg("shape"), py::arg("strides"),
        py::arg("offset"), nogil, "out (compact, prod(shape)) = the view of `a`.");
  m.def("ewise_setitem", &ewise_setitem, py::arg("a"), py::arg("out"), py::arg("shape"),
        py::arg("strides"), py::arg("offset"), nogil,
        "The view of `out` = the compact `a` (prod(shape) elements, row-major).");
  m.def("scalar_setitem", &scalar_setitem, py::arg("size"), py::arg("val"), py::arg("out"),
        py::arg("shape"), py::arg("strides"), py::arg("offset"), nogil,
        "Every element of the view of `out` (`size` = prod(shape) elements) = `val`.");

  // The course's compact entry points, from the list both modules share (ndarray_bindings.h).
#define NEEDLE_BIND_BINARY(name) bind_course_binary(m, #name, true);
#define NEEDLE_BIND_SCALAR(name) bind_course_binary(m, #name, false);
#define NEEDLE_BIND_UNARY(name) bind_course_unary(m, #name);
  NEEDLE_COURSE_BINARY(NEEDLE_BIND_BINARY)
  NEEDLE_COURSE_SCALAR(NEEDLE_BIND_SCALAR)
  NEEDLE_COURSE_UNARY(NEEDLE_BIND_UNARY)
#undef NEEDLE_BIND_BINARY
#undef NEEDLE_BIND_SCALAR
#undef NEEDLE_BIND_UNARY

  m.def("ewise_binary", &ewise_binary, py::arg("op"), py::arg("a"), py::arg("a_strides"),
        py::arg("a_offset"), py::arg("b"), py::arg("b_strides"), py::arg("b_offset"),
        py::arg("out"), py::arg("shape"), nogil,
        "out (compact, prod(shape)) = __binary_ops__[op](view of a, view of b), both of `shape`.");
  m.def("ewise_scalar", &ewise_scalar, py::arg("op"), py::arg("a"), py::arg("a_strides"),
        py::arg("a_offset"), py::arg("val"), py::arg("out"), py::arg("shape"), py::arg("reverse"),
        nogil,
        "out = __binary_ops__[op](view of a, val), or (val, view of a) when `reverse`.");
  m.def("ewise_unary", &ewise_unary, py::arg("op"), py::arg("a"), py::arg("a_strides"),
        py::arg("a_offset"), py::arg("out"), py::arg("shape"), nogil,
        "out = __unary_ops__[op](view of a).");

  m.def("reduce", &reduce, py::arg("op"), py::arg("a"), py::arg("shape"), py::arg("strides"),
        py::arg("offset"), py::arg("keep"), py::arg("out"), nogil,
        "out (compact, prod(shape[:keep])) = __reduce_ops__[op] over the trailing axes "
        "shape[keep:] of the view of `a`; an empty extent gives 0 for sum, ValueError for max.");
  m.def(
      "reduce_sum",
      [](const CudaArray& a, CudaArray& out, idx_t reduce_size) {
        reduce_rows("reduce_sum", needle::ops::ReduceOp::sum, a, out, reduce_size);
      },
      py::arg("a"), py::arg("out"), py::arg("reduce_size"), nogil,
      "out[j] = sum of a[j*reduce_size : (j+1)*reduce_size] (compact a).");
  m.def(
      "reduce_max",
      [](const CudaArray& a, CudaArray& out, idx_t reduce_size) {
        reduce_rows("reduce_max", needle::ops::ReduceOp::max, a, out, reduce_size);
      },
      py::arg("a"), py::arg("out"), py::arg("reduce_size"), nogil,
      "out[j] = max of a[j*reduce_size : (j+1)*reduce_size] (compact a; NaN propagates).");

  m.def("matmul", &matmul, py::arg("a"), py::arg("b"), py::arg("out"), py::arg("m"), py::arg("n"),
        py::arg("p"), nogil, "out (m, p) = a (m, n) @ b (n, p), all compact row-major.");
  constexpr const char* matmul_doc =
      "out (compact, batch + (m, p)) = A[k] @ B[k]; batch is an int or a tuple of batch "
      "dimensions, and A and B are read through one stride per batch dimension, then row and "
      "column (0 shares one matrix across the batch; swapped strides transpose).";
  m.def("matmul_strided", &matmul_strided, py::arg("a"), py::arg("a_strides"),
        py::arg("a_offset"), py::arg("b"), py::arg("b_strides"), py::arg("b_offset"),
        py::arg("out"), py::arg("batch"), py::arg("m"), py::arg("n"), py::arg("p"), nogil,
        matmul_doc);
  m.def(
      "matmul_strided",
      [](const CudaArray& a, const Ints& a_strides, idx_t a_offset, const CudaArray& b,
         const Ints& b_strides, idx_t b_offset, CudaArray& out, idx_t batch, idx_t m, idx_t n,
         idx_t p) {
        matmul_strided(a, a_strides, a_offset, b, b_strides, b_offset, out, Ints{batch}, m, n,
                       p);
      },
      py::arg("a"), py::arg("a_strides"), py::arg("a_offset"), py::arg("b"),
      py::arg("b_strides"), py::arg("b_offset"), py::arg("out"), py::arg("batch"), py::arg("m"),
      py::arg("n"), py::arg("p"), nogil, matmul_doc);
  m.def("matmul_tiled", &matmul_tiled, py::arg("a"), py::arg("b"), py::arg("out"), py::arg("m"),
        py::arg("n"), py::arg("p"), nogil,
        "out = a @ b with all three in the (rows/T, cols/T, T, T) tiled layout, T = "
        "__tile_size__ (a lecture exhibit).");

  // The fused kernels, from the list both modules share (ndarray_bindings.h).
#define NEEDLE_BIND_FUSED(name, doc, ...) needle::bind::def_nogil(m, #name, &name, doc, __VA_ARGS__);
  NEEDLE_FUSED_KERNELS(NEEDLE_BIND_FUSED)
  NEEDLE_CONV_KERNELS(NEEDLE_BIND_FUSED)
#undef NEEDLE_BIND_FUSED
}
