// The CUDA device module of needle's NDArray: declarations shared by the kernels
// (ndarray_backend_cuda.cu, compiled by nvcc) and the pybind11 bindings
// (ndarray_backend_cuda_module.cc, compiled by the C++ compiler).
//
// The host functions declared here trust their arguments: the bindings validate every size,
// shape, stride, offset and op code (src/common/ndarray_checks.h) before calling them. Op codes index
// the shared op tables of src/common/ndarray_ops.h. CUDA failures are thrown as std::runtime_error
// (RuntimeError in Python), a failed cudaMalloc as OutOfMemory (MemoryError).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>
#include <stdexcept>
#include <string>

#include "common/ndarray_checks_conv.h"

namespace needle::cuda {

// Most dimensions an iteration may keep after size-1 dimensions are dropped and contiguous
// neighbours merged (shapes and strides travel to the kernels by value).
constexpr int MAX_DIMS = 16;
// Tile size of the tiled layout that matmul_tiled reads and writes (the module's __tile_size__).
constexpr int TILE = 4;

// A cudaMalloc that failed for lack of device memory (MemoryError in Python).
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A flat float32 buffer in device memory (cudaMalloc'd, freed in the destructor). Constructing
// one without a usable GPU throws std::runtime_error ("CUDA is not available ...").
struct CudaArray {
  explicit CudaArray(int64_t size);
  ~CudaArray();
  CudaArray(const CudaArray&) = delete;
  CudaArray& operator=(const CudaArray&) = delete;

  float* ptr = nullptr;
  int64_t size = 0;
};

// Row-major iteration over `shape` of up to two strided operands: element i (row-major index
// over the shape) of operand k lives at offset[k] + sum_d i_d * strides[k][d]. The bindings
// build it with size-1 dimensions dropped and neighbours that step over each other in every
// operand merged; ndim == 0 means a single element. Compact outputs are indexed by i itself.
struct Strided {
  int ndim = 0;
  int64_t size = 1;  // product of shape
  int64_t shape[MAX_DIMS] = {};
  int64_t strides[2][MAX_DIMS] = {};
  int64_t offset[2] = {};
};

// A batch of matrices: element (k, i, j) lives at
// offset + (k / inner)*batch + (k % inner)*batch_inner + i*row + j*col, a batch of two levels
// (`inner` matrices per outer step, as per-head attention reads (batch, head)); the defaults
// make it one level, offset + k*batch + ...
struct MatrixView {
  int64_t offset = 0, batch = 0, row = 0, col = 0;
  int64_t inner = 1, batch_inner = 0;
};

// ---- device ---------------------------------------------------------------------------------
bool is_available();  // a CUDA device is visible and the driver works
int device_count();

// Bytes held by live CudaArrays and their peak since reset_peak() (memory_stats()).
int64_t live_bytes();
int64_t peak_bytes();
void reset_peak();
void synchronize();

// ---- memory ---------------------------------------------------------------------------------
// to_host writes the view (operand 0 of v) of a, row-major, to host memory dst.
void to_host(const CudaArray& a, const Strided& v, float* dst);
void from_host(const float* src, CudaArray* out);  // copies out->size elements
void fill(CudaArray* out, float val);
// compact: out (compact) = the view (operand 0) of a. ewise_setitem: the view (operand 0) of
// out = compact a. scalar_setitem: every element of the view (operand 0) of out = val.
void compact(const CudaArray& a, CudaArray* out, const Strided& v);
void ewise_setitem(const CudaArray& a, CudaArray* out, const Strided& v);
void scalar_setitem(float val, CudaArray* out, const Strided& v);

// ---- element-wise (op codes of src/common/ndarray_ops.h); out is compact with v.size elements -------
// out = BINARY_OPS[op](view 0 of a, view 1 of b)
void ewise_binary(int op, const CudaArray& a, const CudaArray& b, CudaArray* out,
                  const Strided& v);
// out = BINARY_OPS[op](view 0 of a, val), or BINARY_OPS[op](val, view 0 of a) when reverse
void ewise_scalar(int op, const CudaArray& a, float val, bool reverse, CudaArray* out,
                  const Strided& v);
// out = UNARY_OPS[op](view 0 of a)
void ewise_unary(int op, const CudaArray& a, CudaArray* out, const Strided& v);

// ---- reductions -----------------------------------------------------------------------------
// out[j] (j < outer.size) = REDUCE_OPS[op] over k < inner.size of
// a[view 0 of outer at j + view 0 of inner at k] (inner.offset[0] == 0); inner.size >= 1.
void reduce(int op, const CudaArray& a, const Strided& outer, const Strided& inner,
            CudaArray* out);

// ---- matrix products ------------------------------------------------------------------------
// out (compact, batch x m x p) = A[k] (m x n) @ B[k] (n x p); m, n, p < 2^31 - 1024.
void matmul(const CudaArray& a, const MatrixView& va, const CudaArray& b, const MatrixView& vb,
            CudaArray* out, int64_t batch, int64_t m, int64_t n, int64_t p);
// One group of a product over several batch dimensions: `count` matrices read through va and
// vb, written to out from matrix `first` on.
struct MatmulGroup {
  MatrixView va, vb;
  int64_t first, count;
};
// The products of every group, out compact (all groups' matrices, m x p each).
void matmul(const CudaArray& a, const CudaArray& b, CudaArray* out,
            const std::vector<MatmulGroup>& groups, int64_t m, int64_t n, int64_t p);
// The same product with a, b and out in the (rows/TILE, cols/TILE, TILE, TILE) tiled layout.
void matmul_tiled(const CudaArray& a, const CudaArray& b, CudaArray* out, int64_t m, int64_t n,
                  int64_t p);

// ---- fused kernels (compact operands of the sizes protocol.py states) -------------------------
// Returns -1, or the first row whose label is not an integer in [0, cols).
int64_t softmax_xent(const CudaArray& logits, const CudaArray& labels, int64_t rows,
                     int64_t cols, CudaArray* loss, CudaArray* probs);
// Returns -1, or the first row whose label is not an integer in [0, cols) (then nothing is
// written). dlogits may be probs itself; dloss has rows elements or one shared by every row.
int64_t softmax_xent_bwd(const CudaArray& probs, const CudaArray& labels, const CudaArray& dloss,
                         int64_t rows, int64_t cols, float scale, CudaArray* dlogits);
void layernorm_fwd(const CudaArray& x, const CudaArray& w, const CudaArray& b, int64_t rows,
                   int64_t cols, float eps, CudaArray* y, CudaArray* xhat, CudaArray* rstd);
void layernorm_bwd(const CudaArray& dy, const CudaArray& xhat, const CudaArray& rstd,
                   const CudaArray& w, int64_t rows, int64_t cols, CudaArray* dx, CudaArray* dw,
                   CudaArray* db);
void batchnorm_fwd(const CudaArray& x, const CudaArray& w, const CudaArray& b, int64_t rows,
                   int64_t cols, float eps, CudaArray* y, CudaArray* xhat, CudaArray* rstd,
                   CudaArray* mean, CudaArray* var);
void batchnorm_bwd(const CudaArray& dy, const CudaArray& xhat, const CudaArray& rstd,
                   const CudaArray& w, int64_t rows, int64_t cols, CudaArray* dx, CudaArray* dw,
                   CudaArray* db);
void lstm_cell_fwd(const CudaArray& gates, const CudaArray& c_prev, int64_t batch,
                   int64_t hidden, CudaArray* h, CudaArray* c, CudaArray* act,
                   CudaArray* tanh_c);
void lstm_cell_bwd(const CudaArray& dh, const CudaArray& dc, const CudaArray& act,
                   const CudaArray& c_prev, const CudaArray& tanh_c, int64_t batch,
                   int64_t hidden, CudaArray* dgates, CudaArray* dc_prev);
// An LSTM layer over `steps` steps (protocol.py's lstm_layer_fwd / lstm_layer_bwd): a host loop
// of the matmul and the LSTM cell kernels; m, n, p of its products (batch, hidden, 4*hidden,
// steps*batch) < 2^31 - 1024 (the bindings check).
void lstm_layer_fwd(const CudaArray& xw, const CudaArray& h0, const CudaArray& c0,
                    const CudaArray& w_hh, int64_t batch, int64_t hidden, int64_t steps,
                    CudaArray* out, CudaArray* h, CudaArray* c, CudaArray* act);
void lstm_layer_bwd(const CudaArray& d_out, const CudaArray& dh, const CudaArray& dc,
                    const CudaArray& act, const CudaArray& out, const CudaArray& h0,
                    const CudaArray& c0, const CudaArray& w_hh, int64_t batch, int64_t hidden,
                    int64_t steps, CudaArray* dxw, CudaArray* dh0, CudaArray* dc0,
                    CudaArray* dw_hh);
void sgd_update(CudaArray* param, const CudaArray& grad, CudaArray* buf, float lr,
                float momentum, float weight_decay);
// softmax_fwd / softmax_bwd: see protocol.py (the causal mask over blocks of `queries` rows).
void softmax_fwd(const CudaArray& x, int64_t rows, int64_t cols, float scale, int64_t queries,
                 CudaArray* y);
void softmax_bwd(const CudaArray& y, const CudaArray& dy, int64_t rows, int64_t cols,
                 float scale, CudaArray* dx);
// The embedding kernels return -1, or (having written nothing) the first position of ids whose
// id is not a whole number in [0, vocab). The scatter-add accumulates with atomicAdd.
int64_t embedding_gather(const CudaArray& weight, const CudaArray& ids, int64_t vocab,
                         int64_t cols, int64_t rows, CudaArray* out);
int64_t embedding_scatter_add(const CudaArray& grad, const CudaArray& ids, int64_t rows,
                              int64_t cols, int64_t vocab, CudaArray* out);
// bc1 = 1 - beta1^step, bc2 = 1 - beta2^step (the bias corrections, computed by the caller).
void adam_update(CudaArray* param, const CudaArray& grad, CudaArray* m, CudaArray* v, float lr,
                 float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2);

// The convolutions (protocol.py; geometry checked by the bindings with conv_geometry): im2col or
// col2im kernels around one matmul. The im2col / column-gradient matrix (rows x depth) is a
// temporary; rows, depth and c_out fit an int (the bindings check).
void conv_fwd(const CudaArray& x, const CudaArray& weight, const needle::checks::ConvGeometry& g,
              CudaArray* out);
void conv_input_grad(const CudaArray& grad, const CudaArray& weight,
                     const needle::checks::ConvGeometry& g, CudaArray* out);
void conv_weight_grad(const CudaArray& x, const CudaArray& grad,
                      const needle::checks::ConvGeometry& g, CudaArray* out);

}  // namespace needle::cuda
