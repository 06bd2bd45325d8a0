// CUDA kernels and their host launchers for needle's NDArray (the device protocol of
// needle/backend_ndarray/protocol.py). The pybind11 bindings live in
// ndarray_backend_cuda_module.cc; they validate every argument before calling in here.
// Element-wise ops and reductions come from the shared op table src/common/ndarray_ops.h, so a new op
// there needs no change here. Every CUDA call is checked and failures are thrown as
// std::runtime_error carrying cudaGetErrorString.
#include "cuda/ndarray_backend_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/ndarray_attention.h"
#include "common/ndarray_ops.h"

namespace needle::cuda {
namespace {

constexpr int BLOCK = 256;
// Grid-stride loops cover what a grid of this many blocks does not.
constexpr int64_t MAX_BLOCKS = 65535;

// i over [0, n) in a grid-stride loop (blocks and threads along x).
#define NEEDLE_GRID_LOOP(i, n)                                                   \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    // Clear the (non-sticky) error so that the next launch check does not report it again.
    (void)cudaGetLastError();
    throw std::runtime_error("CUDA error in " + what + ": " + cudaGetErrorString(err));
  }
}

void check_launch(const char* kernel) { check(cudaGetLastError(), std::string(kernel) + " launch"); }

unsigned grid_for(int64_t n, int64_t per_block = BLOCK) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min((n + per_block - 1) / per_block,
                                                             MAX_BLOCKS)));
}

void require_device() {
  static bool found = false;  // only success is cached: a failure is re-checked next time
  if (found) return;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("CUDA is not available (no usable GPU): cudaGetDeviceCount "
                                         "failed: ") + cudaGetErrorString(err));
  }
  if (count == 0) throw std::runtime_error("CUDA is not available: no CUDA device is visible");
  found = true;
}

int sm_count() {
  static int count = 0;
  if (count == 0) {
    int dev = 0, n = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev),
          "cudaDeviceGetAttribute(MultiProcessorCount)");
    count = std::max(n, 1);
  }
  return count;
}

// Runs body(dst) with dst = out->ptr, or, when out shares memory with an input in a way the
// kernel cannot handle in place (`alias`), with a scratch buffer copied into out afterwards.
template <class F>
void into(CudaArray* out, bool alias, F body) {
  if (!alias) return body(out->ptr);
  CudaArray tmp(out->size);
  body(tmp.ptr);
  check(cudaMemcpy(out->ptr, tmp.ptr, out->size * sizeof(float), cudaMemcpyDeviceToDevice),
        "cudaMemcpy device to device");
}

// ---- strided views -----------------------------------------------------------------------------

// The buffer offsets of element i (row-major over d's shape) of the first NOPS operands of d.
// IdxT is 32-bit when the iteration has fewer than 2^31 elements: 64-bit division is several
// times slower on the GPU.
template <int NOPS, typename IdxT>
__device__ __forceinline__ void locate(IdxT i, const Strided& d, int64_t (&off)[NOPS]) {
#pragma unroll
  for (int k = 0; k < NOPS; ++k) off[k] = d.offset[k];
  for (int dim = d.ndim - 1; dim >= 0; --dim) {
    const IdxT n = static_cast<IdxT>(d.shape[dim]);
    const IdxT q = i / n;
    const int64_t r = static_cast<int64_t>(i - q * n);
#pragma unroll
    for (int k = 0; k < NOPS; ++k) off[k] += r * d.strides[k][dim];
    i = q;
  }
}

// Operand k of d walks its buffer with unit stride from offset[k] (or is a single element).
bool contiguous(const Strided& d, int k) {
  return d.ndim == 0 || (d.ndim == 1 && d.strides[k][0] == 1);
}

enum class Copy { Gather, Scatter, Fill };

// Gather: dst[i] = src[view(i)]; Scatter: dst[view(i)] = src[i]; Fill: dst[view(i)] = val.
template <Copy mode, typename IdxT>
__global__ void strided_copy_kernel(const float* src, float* dst, float val, Strided d) {
  NEEDLE_GRID_LOOP(i, d.size) {
    int64_t j[1];
    locate<1, IdxT>(static_cast<IdxT>(i), d, j);
    if (mode == Copy::Gather) {
      dst[i] = src[j[0]];
    } else if (mode == Copy::Scatter) {
      dst[j[0]] = src[i];
    } else {
      dst[j[0]] = val;
    }
  }
}

template <Copy mode>
void launch_strided_copy(const float* src, float* dst, float val, const Strided& d) {
  if (d.size == 0) return;
  if (d.size <= INT32_MAX) {
    strided_copy_kernel<mode, uint32_t><<<grid_for(d.size), BLOCK>>>(src, dst, val, d);
  } else {
    strided_copy_kernel<mode, uint64_t><<<grid_for(d.size), BLOCK>>>(src, dst, val, d);
  }
  check_launch("strided copy kernel");
}

__global__ void fill_kernel(float* out, float val, int64_t n) {
  NEEDLE_GRID_LOOP(i, n) out[i] = val;
}

// ---- element-wise ops (functors from ndarray_ops.h) ---------------------------------------------

// A binary op with one operand fixed: f(x, val), or f(val, x) when reverse.
template <class F>
struct WithScalar {
  F f;
  float val;
  bool reverse;
  __device__ __forceinline__ float operator()(float x) const {
    return reverse ? f(val, x) : f(x, val);
  }
};

template <class F>
__global__ void binary_flat_kernel(const float* a, const float* b, float* out, int64_t n, F f) {
  NEEDLE_GRID_LOOP(i, n) out[i] = f(a[i], b[i]);
}

template <class F, typename IdxT>
__global__ void binary_strided_kernel(const float* a, const float* b, float* out, Strided d,
                                      F f) {
  NEEDLE_GRID_LOOP(i, d.size) {
    int64_t j[2];
    locate<2, IdxT>(static_cast<IdxT>(i), d, j);
    out[i] = f(a[j[0]], b[j[1]]);
  }
}

template <class F>
__global__ void unary_flat_kernel(const float* a, float* out, int64_t n, F f) {
  NEEDLE_GRID_LOOP(i, n) out[i] = f(a[i]);
}

template <class F, typename IdxT>
__global__ void unary_strided_kernel(const float* a, float* out, Strided d, F f) {
  NEEDLE_GRID_LOOP(i, d.size) {
    int64_t j[1];
    locate<1, IdxT>(static_cast<IdxT>(i), d, j);
    out[i] = f(a[j[0]]);
  }
}

template <class F>
void launch_binary(const float* a, const float* b, float* out, const Strided& d, F f) {
  if (contiguous(d, 0) && contiguous(d, 1)) {
    binary_flat_kernel<<<grid_for(d.size), BLOCK>>>(a + d.offset[0], b + d.offset[1], out,
                                                    d.size, f);
  } else if (d.size <= INT32_MAX) {
    binary_strided_kernel<F, uint32_t><<<grid_for(d.size), BLOCK>>>(a, b, out, d, f);
  } else {
    binary_strided_kernel<F, uint64_t><<<grid_for(d.size), BLOCK>>>(a, b, out, d, f);
  }
  check_launch("element-wise kernel");
}

template <class F>
void launch_unary(const float* a, float* out, const Strided& d, F f) {
  if (contiguous(d, 0)) {
    unary_flat_kernel<<<grid_for(d.size), BLOCK>>>(a + d.offset[0], out, d.size, f);
  } else if (d.size <= INT32_MAX) {
    unary_strided_kernel<F, uint32_t><<<grid_for(d.size), BLOCK>>>(a, out, d, f);
  } else {
    unary_strided_kernel<F, uint64_t><<<grid_for(d.size), BLOCK>>>(a, out, d, f);
  }
  check_launch("element-wise kernel");
}

// body(functor) for the op with code `op` in each table (codes are checked by the bindings).
template <class Body>
void with_binary_op(int op, Body body) {
  switch (op) {
#define NEEDLE_CASE(name, ...) \
  case static_cast<int>(needle::ops::BinaryOp::name): return body(needle::ops::Binary_##name{});
    NEEDLE_BINARY_OPS(NEEDLE_CASE)
#undef NEEDLE_CASE
  }
  throw std::invalid_argument("unknown binary op code " + std::to_string(op));
}

template <class Body>
void with_unary_op(int op, Body body) {
  switch (op) {
#define NEEDLE_CASE(name, ...) \
  case static_cast<int>(needle::ops::UnaryOp::name): return body(needle::ops::Unary_##name{});
    NEEDLE_UNARY_OPS(NEEDLE_CASE)
#undef NEEDLE_CASE
  }
  throw std::invalid_argument("unknown unary op code " + std::to_string(op));
}

template <class Body>
void with_reduce_op(int op, Body body) {
  switch (op) {
#define NEEDLE_CASE(name, ...) \
  case static_cast<int>(needle::ops::ReduceOp::name): return body(needle::ops::Reduce_##name{});
    NEEDLE_REDUCE_OPS(NEEDLE_CASE)
#undef NEEDLE_CASE
  }
  throw std::invalid_argument("unknown reduce op code " + std::to_string(op));
}

// out may be one of the inputs only where every element reads its own position.
bool aliased(const CudaArray& in, int k, const CudaArray* out, const Strided& d) {
  return in.ptr == out->ptr && in.ptr != nullptr && !(contiguous(d, k) && d.offset[k] == 0);
}

// ---- reductions --------------------------------------------------------------------------------

template <class R>
__device__ __forceinline__ float warp_reduce(float v, R r) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = r(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;
}

// The reduction of v over the whole block (blockDim.x a multiple of 32), returned to every
// thread. scratch holds 33 floats in shared memory; every thread of the block must call it.
template <class R>
__device__ float block_reduce(float v, R r, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = warp_reduce(v, r);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < nwarps ? scratch[lane] : R::identity();
    v = warp_reduce(v, r);
    if (lane == 0) scratch[32] = v;
  }
  __syncthreads();
  // The next call writes scratch[warp] only after its first barrier, which every thread
  // reaches after reading scratch[32] here.
  return scratch[32];
}

// Offset of element k (row-major) of the reduced extent.
__device__ __forceinline__ int64_t inner_offset(int64_t k, const Strided& inner) {
  if (inner.ndim == 1) return k * inner.strides[0][0];
  int64_t off[1];
  locate<1, int64_t>(k, inner, off);
  return off[0];
}

__device__ __forceinline__ int64_t outer_offset(int64_t j, const Strided& outer) {
  int64_t off[1];
  locate<1, int64_t>(j, outer, off);
  return off[0];
}

// One thread per (output, chunk), for short extents or when neighbouring outputs are
// neighbours in memory and the extent is not (a column sum), so a warp's loads coalesce:
// out[c * rows + j] = the reduction of chunk c (chunk_len elements) of output j's extent.
template <class R>
__global__ void reduce_thread_kernel(const float* a, float* out, Strided outer, Strided inner,
                                     int64_t chunks, int64_t chunk_len, R r) {
  NEEDLE_GRID_LOOP(job, outer.size * chunks) {
    const int64_t j = job % outer.size;
    const int64_t base = outer_offset(j, outer);
    const int64_t begin = (job / outer.size) * chunk_len;
    const int64_t end = min(begin + chunk_len, inner.size);
    float v = R::identity();
    for (int64_t k = begin; k < end; ++k) v = r(v, a[base + inner_offset(k, inner)]);
    out[job] = v;
  }
}

// One warp per output, for extents up to about a thousand elements.
template <class R>
__global__ void reduce_warp_kernel(const float* a, float* out, Strided outer, Strided inner,
                                   R r) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x >> 5;
  // Every lane of a warp has the same output, so the full-mask shuffles see all 32 lanes.
  for (int64_t j = blockIdx.x * warps_per_block + (threadIdx.x >> 5); j < outer.size;
       j += gridDim.x * warps_per_block) {
    const int64_t base = outer_offset(j, outer);
    float v = R::identity();
    for (int64_t k = lane; k < inner.size; k += 32) v = r(v, a[base + inner_offset(k, inner)]);
    v = warp_reduce(v, r);
    if (lane == 0) out[j] = v;
  }
}

// One block per (output, chunk): out[j * chunks + c] = the reduction of chunk c (chunk_len
// elements) of output j's extent.
template <class R>
__global__ void reduce_block_kernel(const float* a, float* out, Strided outer, Strided inner,
                                    int64_t chunks, int64_t chunk_len, R r) {
  __shared__ float scratch[33];
  for (int64_t job = blockIdx.x; job < outer.size * chunks; job += gridDim.x) {
    const int64_t base = outer_offset(job / chunks, outer);
    const int64_t begin = (job % chunks) * chunk_len;
    const int64_t end = min(begin + chunk_len, inner.size);
    float v = R::identity();
    for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x)
      v = r(v, a[base + inner_offset(k, inner)]);
    v = block_reduce(v, r, scratch);
    if (threadIdx.x == 0) out[job] = v;
  }
}

// `count` elements `stride` apart, as one side (outer or inner) of a reduction.
Strided rows_view(int64_t count, int64_t stride) {
  Strided d;
  d.ndim = 1;
  d.size = count;
  d.shape[0] = count;
  d.strides[0][0] = stride;
  return d;
}

template <class R>
void reduce_impl(const float* a, float* out, const Strided& outer, const Strided& inner, R r) {
  const int64_t rows = outer.size, len = inner.size;
  if (rows == 0) return;
  const bool inner_unit = inner.ndim == 0 || inner.strides[0][inner.ndim - 1] == 1;
  const bool outer_unit = outer.ndim > 0 && outer.strides[0][outer.ndim - 1] == 1;
  if (len <= 8 || (outer_unit && !inner_unit)) {
    // Few outputs with long extents: split each extent into chunks of at least THREAD_CHUNK
    // elements (partials laid out chunk-major), then reduce the partials the same way.
    constexpr int64_t THREAD_CHUNK = 1024;
    const int64_t target_threads = 4 * static_cast<int64_t>(sm_count()) * BLOCK;
    int64_t chunks = 1;
    if (rows < target_threads && len >= 2 * THREAD_CHUNK)
      chunks = std::min((target_threads + rows - 1) / rows, len / THREAD_CHUNK);
    const int64_t chunk_len = (len + chunks - 1) / chunks;
    chunks = (len + chunk_len - 1) / chunk_len;  // no empty chunks
    if (chunks == 1) {
      reduce_thread_kernel<<<grid_for(rows), BLOCK>>>(a, out, outer, inner, 1, len, r);
      check_launch("reduce kernel");
      return;
    }
    CudaArray partial(rows * chunks);
    reduce_thread_kernel<<<grid_for(rows * chunks), BLOCK>>>(a, partial.ptr, outer, inner, chunks,
                                                             chunk_len, r);
    check_launch("reduce kernel");
    reduce_impl(partial.ptr, out, rows_view(rows, 1), rows_view(chunks, rows), r);
    return;
  }
  if (len <= 1024) {
    reduce_warp_kernel<<<grid_for(rows, BLOCK / 32), BLOCK>>>(a, out, outer, inner, r);
    check_launch("reduce kernel");
    return;
  }
  // Long extents: one block per output; when there are too few outputs to fill the GPU,
  // split each extent into chunks of at least MIN_CHUNK elements, then reduce the partials.
  constexpr int64_t MIN_CHUNK = 8192;
  const int64_t target_blocks = 4 * static_cast<int64_t>(sm_count());
  int64_t chunks = 1;
  if (rows < target_blocks) {
    chunks = std::min((target_blocks + rows - 1) / rows, (len + MIN_CHUNK - 1) / MIN_CHUNK);
    chunks = std::max<int64_t>(chunks, 1);
  }
  const int64_t chunk_len = (len + chunks - 1) / chunks;
  chunks = (len + chunk_len - 1) / chunk_len;  // no empty chunks
  const unsigned blocks = static_cast<unsigned>(std::min(rows * chunks, MAX_BLOCKS));
  if (chunks == 1) {
    reduce_block_kernel<<<blocks, BLOCK>>>(a, out, outer, inner, chunks, chunk_len, r);
    check_launch("reduce kernel");
    return;
  }
  CudaArray partial(rows * chunks);
  reduce_block_kernel<<<blocks, BLOCK>>>(a, partial.ptr, outer, inner, chunks, chunk_len, r);
  check_launch("reduce kernel");
  reduce_impl(partial.ptr, out, rows_view(rows, chunks), rows_view(chunks, 1), r);
}

// ---- matmul ------------------------------------------------------------------------------------

// C[k] (M, P) = A[k] (M, N) @ B[k] (N, P) for k < batch, A and B read through their strides,
// C compact. Each block computes a BM x BN tile of one C[k]: it stages BM x BK tiles of A
// (stored transposed, padded against bank conflicts) and BK x BN tiles of B through shared
// memory, and each thread accumulates a TM x TN block of outputs in registers. A thread's
// outputs are strided by the thread-grid size (rows ty + i*TY, columns tx + j*TX), so a warp's
// shared-memory reads hit distinct banks or broadcast, and its stores coalesce. Loads walk the
// operand's unit-stride dimension across consecutive threads (a_rows_fast: A is transposed;
// b_k_fast: B is transposed), so they coalesce either way. Out-of-range elements load as 0
// and are not stored, so any M, N, P work.
template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
matmul_kernel(const float* __restrict__ A, MatrixView va, bool a_rows_fast,
              const float* __restrict__ B, MatrixView vb, bool b_k_fast, float* __restrict__ C,
              int64_t batch, int M, int N, int P, int tiles_p) {
  constexpr int TX = BN / TN;
  constexpr int TY = BM / TM;
  constexpr int THREADS = TX * TY;
  static_assert((BM * BK) % THREADS == 0 && (BK * BN) % THREADS == 0, "tile loads must divide");
  __shared__ float As[BK][BM + 4];
  __shared__ float Bs[BK][BN + 4];

  const int tid = threadIdx.x;
  const int tx = tid % TX;
  const int ty = tid / TX;
  const int row0 = (blockIdx.x / tiles_p) * BM;
  const int col0 = (blockIdx.x % tiles_p) * BN;

  for (int64_t bk = blockIdx.y; bk < batch; bk += gridDim.y) {
    const float* Ak = A + va.offset + (bk / va.inner) * va.batch + (bk % va.inner) * va.batch_inner;
    const float* Bk = B + vb.offset + (bk / vb.inner) * vb.batch + (bk % vb.inner) * vb.batch_inner;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
    }

    for (int k0 = 0; k0 < N; k0 += BK) {
#pragma unroll
      for (int l = 0; l < (BM * BK) / THREADS; ++l) {
        const int idx = tid + l * THREADS;
        const int r = a_rows_fast ? idx % BM : idx / BK;
        const int c = a_rows_fast ? idx / BM : idx % BK;
        const int gr = row0 + r, gc = k0 + c;
        As[c][r] = (gr < M && gc < N) ? Ak[gr * va.row + gc * va.col] : 0.f;
      }
#pragma unroll
      for (int l = 0; l < (BK * BN) / THREADS; ++l) {
        const int idx = tid + l * THREADS;
        const int r = b_k_fast ? idx % BK : idx / BN;
        const int c = b_k_fast ? idx / BK : idx % BN;
        const int gr = k0 + r, gc = col0 + c;
        Bs[r][c] = (gr < N && gc < P) ? Bk[gr * vb.row + gc * vb.col] : 0.f;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < BK; ++k) {
        float ra[TM], rb[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) ra[i] = As[k][ty + i * TY];
#pragma unroll
        for (int j = 0; j < TN; ++j) rb[j] = Bs[k][tx + j * TX];
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
        }
      }
      __syncthreads();  // the tiles are overwritten next iteration
    }

    float* Ck = C + bk * static_cast<int64_t>(M) * P;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int r = row0 + ty + i * TY;
      if (r >= M) continue;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int c = col0 + tx + j * TX;
        if (c < P) Ck[static_cast<int64_t>(r) * P + c] = acc[i][j];
      }
    }
  }
}

template <int BM, int BN, int BK, int TM, int TN>
void launch_matmul(const float* a, const MatrixView& va, const float* b, const MatrixView& vb,
                   float* out, int64_t batch, int m, int n, int p) {
  const int64_t tiles_m = (static_cast<int64_t>(m) + BM - 1) / BM;
  const int64_t tiles_p = (static_cast<int64_t>(p) + BN - 1) / BN;
  if (tiles_m * tiles_p > INT32_MAX) {
    throw std::invalid_argument("matmul: output of " + std::to_string(m) + " x " +
                                std::to_string(p) + " needs too many thread blocks");
  }
  const dim3 grid(static_cast<unsigned>(tiles_m * tiles_p),
                  static_cast<unsigned>(std::min<int64_t>(batch, MAX_BLOCKS)));
  const bool a_rows_fast = va.row == 1 && va.col != 1;
  const bool b_k_fast = vb.row == 1 && vb.col != 1;
  matmul_kernel<BM, BN, BK, TM, TN><<<grid, (BM / TM) * (BN / TN)>>>(
      a, va, a_rows_fast, b, vb, b_k_fast, out, batch, m, n, p, static_cast<int>(tiles_p));
  check_launch("matmul kernel");
}

// One thread per output element of the tiled-layout product (a lecture exhibit, not tuned).
__global__ void matmul_tiled_kernel(const float* a, const float* b, float* out, int64_t m,
                                    int64_t n, int64_t p) {
  constexpr int64_t T = TILE;
  NEEDLE_GRID_LOOP(e, m * p) {
    const int64_t i = e / p, j = e % p;
    float acc = 0.f;
    for (int64_t k = 0; k < n; ++k) {
      const float x = a[((i / T) * (n / T) + k / T) * T * T + (i % T) * T + k % T];
      const float y = b[((k / T) * (p / T) + j / T) * T * T + (k % T) * T + j % T];
      acc = fmaf(x, y, acc);
    }
    out[((i / T) * (p / T) + j / T) * T * T + (i % T) * T + j % T] = acc;
  }
}

// ---- fused kernels -----------------------------------------------------------------------------

// Threads for one block per row of `cols` elements: a multiple of 32, at most BLOCK.
unsigned row_threads(int64_t cols) {
  return static_cast<unsigned>(std::min<int64_t>(BLOCK, std::max<int64_t>(32, (cols + 31) / 32 * 32)));
}

__device__ unsigned long long g_bad_label_row;

// One block's row of a softmax: p[j] = exp(scale * x[j] - m) for j < n, m the largest
// scale * x[j] (0 when it is not finite: an all -inf row stays NaN, as the numpy reference).
// Returns {m, the sum of the p[j]} on every thread.
__device__ float2 block_exp_row(const float* x, int64_t n, float scale, float* p,
                                float* scratch) {
  const needle::ops::Reduce_max max_op;
  const needle::ops::Reduce_sum sum_op;
  float m = needle::ops::Reduce_max::identity();
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = max_op(m, scale * x[j]);
  m = block_reduce(m, max_op, scratch);
  if (!(fabsf(m) < INFINITY)) m = 0.f;
  float s = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    p[j] = expf(scale * x[j] - m);
    s += p[j];
  }
  return make_float2(m, block_reduce(s, sum_op, scratch));
}

__global__ void softmax_xent_kernel(const float* logits, const float* labels, int64_t rows,
                                    int64_t cols, float* loss, float* probs) {
  __shared__ float scratch[33];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* x = logits + r * cols;
    float* p = probs + r * cols;
    const float2 ms = block_exp_row(x, cols, 1.f, p, scratch);
    const float m = ms.x, s = ms.y;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) p[j] /= s;
    if (threadIdx.x == 0) {
      const float label = labels[r];
      if (label >= 0.f && label < static_cast<float>(cols) && label == floorf(label)) {
        loss[r] = (m - x[static_cast<int64_t>(label)]) + logf(s);
      } else {
        loss[r] = NAN;
        atomicMin(&g_bad_label_row, static_cast<unsigned long long>(r));
      }
    }
  }
}

// softmax_fwd: one block per row; keys past the row's causal limit get 0 and are not read.
__global__ void softmax_fwd_kernel(const float* x, int64_t rows, int64_t cols, float scale,
                                   int64_t queries, float* y) {
  __shared__ float scratch[33];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const int64_t n = needle::checks::softmax_visible(r, cols, queries);
    if (n == 0) {  // every key masked: uniform, as the course's finite mask gives
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = 1.f / cols;
      continue;
    }
    const float s = block_exp_row(xr, n, scale, yr, scratch).y;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = j < n ? yr[j] / s : 0.f;
  }
}

// softmax_bwd: one block per row, dx = scale * y * (dy - sum(dy * y)).
__global__ void softmax_bwd_kernel(const float* y, const float* dy, int64_t rows, int64_t cols,
                                   float scale, float* dx) {
  __shared__ float scratch[33];
  const needle::ops::Reduce_sum sum_op;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* yr = y + r * cols;
    const float* gr = dy + r * cols;
    float dot = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dot += yr[j] * gr[j];
    dot = block_reduce(dot, sum_op, scratch);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dx[r * cols + j] = scale * (yr[j] * (gr[j] - dot));
  }
}

// The first position r < rows whose id is not a whole number in [0, vocab), by atomicMin.
__device__ unsigned long long g_bad_id_row;

__global__ void check_ids_kernel(const float* ids, int64_t rows, int64_t vocab) {
  NEEDLE_GRID_LOOP(r, rows) {
    const float id = ids[r];
    if (!(id >= 0.f && static_cast<double>(id) < static_cast<double>(vocab) && id == floorf(id)))
      atomicMin(&g_bad_id_row, static_cast<unsigned long long>(r));
  }
}

// softmax_xent_bwd, element-wise: d may be probs itself (each thread reads, then writes, its
// own element); dloss has one element per row, or one shared (shared = 1).
__global__ void softmax_xent_bwd_kernel(const float* probs, const float* labels,
                                        const float* dloss, int64_t rows, int64_t cols,
                                        int shared, float scale, float* d) {
  NEEDLE_GRID_LOOP(i, rows * cols) {
    const int64_t r = i / cols, j = i - r * cols;
    const float k = dloss[shared ? 0 : r] * scale;
    d[i] = (j == static_cast<int64_t>(labels[r]) ? probs[i] - 1.f : probs[i]) * k;
  }
}

__global__ void embedding_gather_kernel(const float* weight, const float* ids, int64_t cols,
                                        int64_t rows, float* out) {
  NEEDLE_GRID_LOOP(i, rows * cols) {
    const int64_t r = i / cols, j = i - r * cols;
    out[i] = weight[static_cast<int64_t>(ids[r]) * cols + j];
  }
}

// out[ids[r]] += grad[r] by atomicAdd: repeated ids accumulate, in no fixed order.
__global__ void embedding_scatter_add_kernel(const float* grad, const float* ids, int64_t cols,
                                             int64_t rows, float* out) {
  NEEDLE_GRID_LOOP(i, rows * cols) {
    const int64_t r = i / cols, j = i - r * cols;
    atomicAdd(out + static_cast<int64_t>(ids[r]) * cols + j, grad[i]);
  }
}

__global__ void layernorm_fwd_kernel(const float* x, const float* w, const float* b,
                                     int64_t rows, int64_t cols, float eps, float* y,
                                     float* xhat, float* rstd) {
  __shared__ float scratch[33];
  const needle::ops::Reduce_sum sum_op;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += xr[j];
    const float mean = block_reduce(s, sum_op, scratch) / cols;
    float q = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float d = xr[j] - mean;
      q += d * d;
    }
    const float q_total = block_reduce(q, sum_op, scratch);  // the same on every thread
    float rs = 1.f / sqrtf(q_total / cols + eps);
    if (!isfinite(q_total)) {
      // Data above about 2e19 in magnitude: the variance overflows float, its rstd does not.
      // Sum the squares of (x - mean) / m, m = max |x - mean|, and scale back in the rstd.
      float m = 0.f;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, fabsf(xr[j] - mean));
      m = block_reduce(m, needle::ops::Reduce_max(), scratch);
      float qs = 0.f;
      for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
        const float d = (xr[j] - mean) / m;
        qs += d * d;
      }
      rs = (1.f / m) / sqrtf(block_reduce(qs, sum_op, scratch) / cols + eps / (m * m));
    }
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float h = (xr[j] - mean) * rs;
      xhat[r * cols + j] = h;
      y[r * cols + j] = h * w[j] + b[j];
    }
    if (threadIdx.x == 0) rstd[r] = rs;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) per row, with g = dy * w.
__global__ void layernorm_bwd_kernel(const float* dy, const float* xhat, const float* rstd,
                                     const float* w, int64_t rows, int64_t cols, float* dx) {
  __shared__ float scratch[33];
  const needle::ops::Reduce_sum sum_op;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * cols;
    const float* hr = xhat + r * cols;
    float s1 = 0.f, s2 = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float g = dyr[j] * w[j];
      s1 += g;
      s2 += g * hr[j];
    }
    const float mean_g = block_reduce(s1, sum_op, scratch) / cols;
    const float mean_gh = block_reduce(s2, sum_op, scratch) / cols;
    const float rs = rstd[r];
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      dx[r * cols + j] = rs * (dyr[j] * w[j] - mean_g - hr[j] * mean_gh);
  }
}

// Column kernels run blocks of COL_X x COL_Y threads: threadIdx.x picks a column of a tile of
// COL_X columns, threadIdx.y a residue class of rows; column_sum joins the COL_Y partials.
constexpr int COL_X = 32, COL_Y = 8;

// The sum of v over threadIdx.y for this thread's column, returned to every thread of the
// block (all must call it).
__device__ float column_sum(float v, float (*scratch)[COL_X + 1]) {
  scratch[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int y = 0; y < COL_Y; ++y) s += scratch[y][threadIdx.x];
  __syncthreads();  // scratch is reused by the next call
  return s;
}

// The maximum of v over threadIdx.y for this thread's column, as column_sum.
__device__ float column_max(float v, float (*scratch)[COL_X + 1]) {
  scratch[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  float m = scratch[0][threadIdx.x];
#pragma unroll
  for (int y = 1; y < COL_Y; ++y) m = fmaxf(m, scratch[y][threadIdx.x]);
  __syncthreads();
  return m;
}

// dw[c] = sum_r dy[r, c] * xhat[r, c], db[c] = sum_r dy[r, c] (LayerNorm's parameter gradients).
__global__ void column_grads_kernel(const float* dy, const float* xhat, int64_t rows,
                                    int64_t cols, float* dw, float* db) {
  __shared__ float scratch[COL_Y][COL_X + 1];
  for (int64_t c0 = blockIdx.x * static_cast<int64_t>(COL_X); c0 < cols;
       c0 += static_cast<int64_t>(gridDim.x) * COL_X) {
    const int64_t c = c0 + threadIdx.x;
    float sw = 0.f, sb = 0.f;
    if (c < cols) {
      for (int64_t r = threadIdx.y; r < rows; r += COL_Y) {
        const float g = dy[r * cols + c];
        sb += g;
        sw += g * xhat[r * cols + c];
      }
    }
    sw = column_sum(sw, scratch);
    sb = column_sum(sb, scratch);
    if (c < cols && threadIdx.y == 0) {
      dw[c] = sw;
      db[c] = sb;
    }
  }
}

__global__ void batchnorm_fwd_kernel(const float* x, const float* w, const float* b,
                                     int64_t rows, int64_t cols, float eps, float* y,
                                     float* xhat, float* rstd, float* mean_out,
                                     float* var_out) {
  __shared__ float scratch[COL_Y][COL_X + 1];
  for (int64_t c0 = blockIdx.x * static_cast<int64_t>(COL_X); c0 < cols;
       c0 += static_cast<int64_t>(gridDim.x) * COL_X) {
    const int64_t c = c0 + threadIdx.x;
    const bool valid = c < cols;
    float s = 0.f;
    if (valid)
      for (int64_t r = threadIdx.y; r < rows; r += COL_Y) s += x[r * cols + c];
    const float mean = column_sum(s, scratch) / rows;
    float q = 0.f;
    if (valid)
      for (int64_t r = threadIdx.y; r < rows; r += COL_Y) {
        const float d = x[r * cols + c] - mean;
        q += d * d;
      }
    const float var = column_sum(q, scratch) / rows;
    float rs = 1.f / sqrtf(var + eps);
    // Data above about 2e19 in magnitude: the variance overflows float, its rstd does not. If
    // any column of the block overflowed (all threads take this branch together, as the
    // barriers inside column_sum require), rescale by m = max |x - mean| of each column.
    if (__syncthreads_or(valid && !isfinite(var))) {
      float m = 0.f;
      if (valid)
        for (int64_t r = threadIdx.y; r < rows; r += COL_Y) m = fmaxf(m, fabsf(x[r * cols + c] - mean));
      m = column_max(m, scratch);
      float qs = 0.f;
      if (valid && m > 0.f)
        for (int64_t r = threadIdx.y; r < rows; r += COL_Y) {
          const float d = (x[r * cols + c] - mean) / m;
          qs += d * d;
        }
      qs = column_sum(qs, scratch);
      if (!isfinite(var)) rs = (1.f / m) / sqrtf(qs / rows + eps / (m * m));
    }
    if (valid) {
      const float wc = w[c], bc = b[c];
      for (int64_t r = threadIdx.y; r < rows; r += COL_Y) {
        const float h = (x[r * cols + c] - mean) * rs;
        xhat[r * cols + c] = h;
        y[r * cols + c] = h * wc + bc;
      }
      if (threadIdx.y == 0) {
        mean_out[c] = mean;
        var_out[c] = var;
        rstd[c] = rs;
      }
    }
  }
}

// Per column: db = sum dy, dw = sum dy * xhat, dx = rstd * w * (dy - db/rows - xhat * dw/rows).
__global__ void batchnorm_bwd_kernel(const float* dy, const float* xhat, const float* rstd,
                                     const float* w, int64_t rows, int64_t cols, float* dx,
                                     float* dw, float* db) {
  __shared__ float scratch[COL_Y][COL_X + 1];
  for (int64_t c0 = blockIdx.x * static_cast<int64_t>(COL_X); c0 < cols;
       c0 += static_cast<int64_t>(gridDim.x) * COL_X) {
    const int64_t c = c0 + threadIdx.x;
    const bool valid = c < cols;
    float sb = 0.f, sw = 0.f;
    if (valid)
      for (int64_t r = threadIdx.y; r < rows; r += COL_Y) {
        const float g = dy[r * cols + c];
        sb += g;
        sw += g * xhat[r * cols + c];
      }
    sb = column_sum(sb, scratch);
    sw = column_sum(sw, scratch);
    if (valid) {
      const float scale = rstd[c] * w[c];
      const float mean_g = sb / rows, mean_gh = sw / rows;
      for (int64_t r = threadIdx.y; r < rows; r += COL_Y)
        dx[r * cols + c] = scale * (dy[r * cols + c] - mean_g - xhat[r * cols + c] * mean_gh);
      if (threadIdx.y == 0) {
        dw[c] = sw;
        db[c] = sb;
      }
    }
  }
}

dim3 column_grid(int64_t cols) { return dim3(grid_for(cols, COL_X)); }

// One LSTM step, one thread per (row, j): act from gates (+ xw when not null; act may be gates
// itself: a thread reads its four pre-activations before writing them), c, h and (when not
// null) tanh_c.
__global__ void lstm_cell_fwd_kernel(const float* gates, const float* xw, const float* c_prev,
                                     int64_t batch, int64_t hidden, float* h, float* c,
                                     float* act, float* tanh_c) {
  const needle::ops::Unary_sigmoid sigmoid;
  const needle::ops::Unary_tanh tanh_op;
  NEEDLE_GRID_LOOP(e, batch * hidden) {
    const int64_t row = e / hidden, j = e % hidden;
    const float* g = gates + row * 4 * hidden;
    float* a = act + row * 4 * hidden;
    float pre[4];
    for (int k = 0; k < 4; ++k) {
      const int64_t at = k * hidden + j;
      pre[k] = xw ? g[at] + xw[row * 4 * hidden + at] : g[at];
    }
    const float i_g = sigmoid(pre[0]), f_g = sigmoid(pre[1]);
    const float g_g = tanh_op(pre[2]), o_g = sigmoid(pre[3]);
    a[j] = i_g;
    a[hidden + j] = f_g;
    a[2 * hidden + j] = g_g;
    a[3 * hidden + j] = o_g;
    const float cc = f_g * c_prev[e] + i_g * g_g;
    const float tc = tanh_op(cc);
    c[e] = cc;
    if (tanh_c) tanh_c[e] = tc;
    h[e] = o_g * tc;
  }
}

// The step's gradients with the adjoint dh (+ dh_add when not null) of h, and tanh(c) read from
// tanh_c or, when that is null, computed from c; dc_prev may be dc itself.
__global__ void lstm_cell_bwd_kernel(const float* dh, const float* dh_add, const float* dc,
                                     const float* act, const float* c_prev, const float* tanh_c,
                                     const float* c, int64_t batch, int64_t hidden,
                                     float* dgates, float* dc_prev) {
  const needle::ops::Unary_tanh tanh_op;
  NEEDLE_GRID_LOOP(e, batch * hidden) {
    const int64_t row = e / hidden, j = e % hidden;
    const float* a = act + row * 4 * hidden;
    float* dg = dgates + row * 4 * hidden;
    const float i_g = a[j], f_g = a[hidden + j], g_g = a[2 * hidden + j], o_g = a[3 * hidden + j];
    const float tc = tanh_c ? tanh_c[e] : tanh_op(c[e]);
    const float dhe = dh_add ? dh[e] + dh_add[e] : dh[e];
    const float dct = dc[e] + dhe * o_g * (1.f - tc * tc);  // adjoint of c, both paths
    dg[j] = dct * g_g * i_g * (1.f - i_g);
    dg[hidden + j] = dct * c_prev[e] * f_g * (1.f - f_g);
    dg[2 * hidden + j] = dct * i_g * (1.f - g_g * g_g);
    dg[3 * hidden + j] = dhe * tc * o_g * (1.f - o_g);
    dc_prev[e] = dct * f_g;
  }
}

// c_all[t] = σf_t·c_{t-1} + σi_t·tanh g_t for t < steps (c_{-1} = c0), from the activations act
// (steps x batch x 4·hidden): the cell states lstm_layer_fwd did not keep, one thread per
// (row, j) running through the steps.
__global__ void lstm_cell_states_kernel(const float* act, const float* c0, int64_t batch,
                                        int64_t hidden, int64_t steps, float* c_all) {
  const int64_t n = batch * hidden;
  NEEDLE_GRID_LOOP(e, n) {
    const int64_t row = e / hidden, j = e % hidden;
    float c = c0[e];
    for (int64_t t = 0; t < steps; ++t) {
      const float* a = act + (t * batch + row) * 4 * hidden;
      c = a[hidden + j] * c + a[j] * a[2 * hidden + j];
      c_all[t * n + e] = c;
    }
  }
}

__global__ void sgd_kernel(float* param, const float* grad, float* buf, int64_t n, float lr,
                           float momentum, float weight_decay) {
  NEEDLE_GRID_LOOP(i, n) {
    const float g = grad[i] + weight_decay * param[i];
    // momentum 0: buf = g, its previous contents not read (the optimizer passes a scratch)
    const float u = momentum == 0.f ? g : momentum * buf[i] + (1.f - momentum) * g;
    buf[i] = u;
    param[i] -= lr * u;
  }
}

__global__ void adam_kernel(float* param, const float* grad, float* m, float* v, int64_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            float bc1, float bc2) {
  NEEDLE_GRID_LOOP(i, n) {
    const float g = grad[i] + weight_decay * param[i];
    const float mi = beta1 * m[i] + (1.f - beta1) * g;
    const float vi = beta2 * v[i] + (1.f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
  }
}

}  // namespace

// ---- public host functions ---------------------------------------------------------------------

namespace {
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};
}  // namespace

int64_t live_bytes() { return g_live_bytes.load(); }
int64_t peak_bytes() { return g_peak_bytes.load(); }
void reset_peak() { g_peak_bytes.store(g_live_bytes.load()); }

CudaArray::CudaArray(int64_t size_) : size(size_) {
  require_device();
  if (size > 0) {
    void* p = nullptr;
    const size_t bytes = static_cast<size_t>(size) * sizeof(float);
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw OutOfMemory("cudaMalloc of " + std::to_string(bytes) + " bytes: out of device memory");
    }
    check(err, "cudaMalloc of " + std::to_string(bytes) + " bytes");
    ptr = static_cast<float*>(p);
    const int64_t live = g_live_bytes.fetch_add(int64_t(bytes)) + int64_t(bytes);
    int64_t peak = g_peak_bytes.load();
    while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live)) {
    }
  }
}

CudaArray::~CudaArray() {
  // A destructor cannot throw; at interpreter exit the runtime may already be unloading.
  if (ptr == nullptr) return;
  g_live_bytes.fetch_sub(size * int64_t(sizeof(float)));
  if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
}

bool is_available() { return device_count() > 0; }

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

void synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

void to_host(const CudaArray& a, const Strided& v, float* dst) {
  if (v.size == 0) return;
  const size_t bytes = static_cast<size_t>(v.size) * sizeof(float);
  if (contiguous(v, 0)) {
    check(cudaMemcpy(dst, a.ptr + v.offset[0], bytes, cudaMemcpyDeviceToHost),
          "cudaMemcpy device to host");
    return;
  }
  CudaArray tmp(v.size);
  launch_strided_copy<Copy::Gather>(a.ptr, tmp.ptr, 0.f, v);
  check(cudaMemcpy(dst, tmp.ptr, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
}

void from_host(const float* src, CudaArray* out) {
  if (out->size == 0) return;
  check(cudaMemcpy(out->ptr, src, static_cast<size_t>(out->size) * sizeof(float),
                   cudaMemcpyHostToDevice),
        "cudaMemcpy host to device");
}

void fill(CudaArray* out, float val) {
  if (out->size == 0) return;
  fill_kernel<<<grid_for(out->size), BLOCK>>>(out->ptr, val, out->size);
  check_launch("fill kernel");
}

// question: hw3_compact
void compact(const CudaArray& a, CudaArray* out, const Strided& v) {
  into(out, a.ptr == out->ptr && v.size > 0,
       [&](float* dst) { launch_strided_copy<Copy::Gather>(a.ptr, dst, 0.f, v); });
}

// question: hw3_setitem
void ewise_setitem(const CudaArray& a, CudaArray* out, const Strided& v) {
  if (a.ptr == out->ptr && v.size > 0) {  // source and destination share memory
    CudaArray tmp(a.size);
    check(cudaMemcpy(tmp.ptr, a.ptr, static_cast<size_t>(a.size) * sizeof(float),
                     cudaMemcpyDeviceToDevice),
          "cudaMemcpy device to device");
    launch_strided_copy<Copy::Scatter>(tmp.ptr, out->ptr, 0.f, v);
    return;
  }
  launch_strided_copy<Copy::Scatter>(a.ptr, out->ptr, 0.f, v);
}

// question: hw3_setitem
void scalar_setitem(float val, CudaArray* out, const Strided& v) {
  launch_strided_copy<Copy::Fill>(nullptr, out->ptr, val, v);
}

// question: hw3_ewise_ops
void ewise_binary(int op, const CudaArray& a, const CudaArray& b, CudaArray* out,
                  const Strided& v) {
  if (v.size == 0) return;
  into(out, aliased(a, 0, out, v) || aliased(b, 1, out, v), [&](float* dst) {
    with_binary_op(op, [&](auto f) { launch_binary(a.ptr, b.ptr, dst, v, f); });
  });
}

// question: hw3_scalar_ops
void ewise_scalar(int op, const CudaArray& a, float val, bool reverse, CudaArray* out,
                  const Strided& v) {
  if (v.size == 0) return;
  into(out, aliased(a, 0, out, v), [&](float* dst) {
    with_binary_op(op, [&](auto f) {
      launch_unary(a.ptr, dst, v, WithScalar<decltype(f)>{f, val, reverse});
    });
  });
}

// question: hw3_ewise_ops
void ewise_unary(int op, const CudaArray& a, CudaArray* out, const Strided& v) {
  if (v.size == 0) return;
  into(out, aliased(a, 0, out, v), [&](float* dst) {
    with_unary_op(op, [&](auto f) { launch_unary(a.ptr, dst, v, f); });
  });
}

// question: hw3_reductions
void reduce(int op, const CudaArray& a, const Strided& outer, const Strided& inner,
            CudaArray* out) {
  if (outer.size == 0) return;
  into(out, a.ptr == out->ptr, [&](float* dst) {
    with_reduce_op(op, [&](auto r) { reduce_impl(a.ptr, dst, outer, inner, r); });
  });
}

void matmul(const CudaArray& a, const MatrixView& va, const CudaArray& b, const MatrixView& vb,
            CudaArray* out, int64_t batch, int64_t m, int64_t n, int64_t p) {
  matmul(a, b, out, {MatmulGroup{va, vb, 0, batch}}, m, n, p);
}

// question: hw3_matmul
void matmul(const CudaArray& a, const CudaArray& b, CudaArray* out,
            const std::vector<MatmulGroup>& groups, int64_t m, int64_t n, int64_t p) {
  int64_t total = 0;
  for (const MatmulGroup& g : groups) total += g.count;
  if (total == 0 || m == 0 || p == 0) return;
  into(out, out->ptr == a.ptr || out->ptr == b.ptr, [&](float* dst) {
    if (n == 0) {
      fill_kernel<<<grid_for(total * m * p), BLOCK>>>(dst, 0.f, total * m * p);
      check_launch("fill kernel");
      return;
    }
    const int M = static_cast<int>(m), N = static_cast<int>(n), P = static_cast<int>(p);
    for (const MatmulGroup& g : groups) {
      float* c = dst + g.first * m * p;
      // Large outputs: 128x128 tiles, 8x8 per thread. Otherwise 64x64 tiles, 4x4 per thread,
      // so that more blocks keep the multiprocessors busy.
      const int64_t big_tiles = ((m + 127) / 128) * ((p + 127) / 128) * g.count;
      if (big_tiles >= 2 * static_cast<int64_t>(sm_count())) {
        launch_matmul<128, 128, 8, 8, 8>(a.ptr, g.va, b.ptr, g.vb, c, g.count, M, N, P);
      } else {
        launch_matmul<64, 64, 8, 4, 4>(a.ptr, g.va, b.ptr, g.vb, c, g.count, M, N, P);
      }
    }
  });
}

// question: hw3_matmul
void matmul_tiled(const CudaArray& a, const CudaArray& b, CudaArray* out, int64_t m, int64_t n,
                  int64_t p) {
  if (m == 0 || p == 0) return;
  into(out, out->ptr == a.ptr || out->ptr == b.ptr, [&](float* dst) {
    matmul_tiled_kernel<<<grid_for(m * p), BLOCK>>>(a.ptr, b.ptr, dst, m, n, p);
    check_launch("matmul_tiled kernel");
  });
}

int64_t softmax_xent(const CudaArray& logits, const CudaArray& labels, int64_t rows,
                     int64_t cols, CudaArray* loss, CudaArray* probs) {
  if (rows == 0) return -1;
  const unsigned long long none = ~0ull;
  check(cudaMemcpyToSymbol(g_bad_label_row, &none, sizeof(none)), "cudaMemcpyToSymbol");
  softmax_xent_kernel<<<grid_for(rows, 1), row_threads(cols)>>>(logits.ptr, labels.ptr, rows,
                                                                cols, loss->ptr, probs->ptr);
  check_launch("softmax_xent kernel");
  unsigned long long bad = none;
  check(cudaMemcpyFromSymbol(&bad, g_bad_label_row, sizeof(bad)), "cudaMemcpyFromSymbol");
  return bad == none ? -1 : static_cast<int64_t>(bad);
}

void softmax_fwd(const CudaArray& x, int64_t rows, int64_t cols, float scale, int64_t queries,
                 CudaArray* y) {
  if (rows == 0 || cols == 0) return;
  softmax_fwd_kernel<<<grid_for(rows, 1), row_threads(cols)>>>(x.ptr, rows, cols, scale, queries,
                                                               y->ptr);
  check_launch("softmax_fwd kernel");
}

void softmax_bwd(const CudaArray& y, const CudaArray& dy, int64_t rows, int64_t cols,
                 float scale, CudaArray* dx) {
  if (rows == 0 || cols == 0) return;
  softmax_bwd_kernel<<<grid_for(rows, 1), row_threads(cols)>>>(y.ptr, dy.ptr, rows, cols, scale,
                                                               dx->ptr);
  check_launch("softmax_bwd kernel");
}

namespace {
// -1, or the first position of `ids` (rows) whose id is not a whole number in [0, vocab).
int64_t first_bad_id(const CudaArray& ids, int64_t rows, int64_t vocab) {
  if (rows == 0) return -1;
  const unsigned long long none = ~0ull;
  check(cudaMemcpyToSymbol(g_bad_id_row, &none, sizeof(none)), "cudaMemcpyToSymbol");
  check_ids_kernel<<<grid_for(rows), BLOCK>>>(ids.ptr, rows, vocab);
  check_launch("check_ids kernel");
  unsigned long long bad = none;
  check(cudaMemcpyFromSymbol(&bad, g_bad_id_row, sizeof(bad)), "cudaMemcpyFromSymbol");
  return bad == none ? -1 : static_cast<int64_t>(bad);
}
}  // namespace

int64_t softmax_xent_bwd(const CudaArray& probs, const CudaArray& labels, const CudaArray& dloss,
                         int64_t rows, int64_t cols, float scale, CudaArray* dlogits) {
  // the labels are checked before anything is written: dlogits may be probs itself
  const int64_t bad = first_bad_id(labels, rows, cols);
  if (bad >= 0 || rows * cols == 0) return bad;
  softmax_xent_bwd_kernel<<<grid_for(rows * cols), BLOCK>>>(
      probs.ptr, labels.ptr, dloss.ptr, rows, cols, dloss.size == 1 ? 1 : 0, scale, dlogits->ptr);
  check_launch("softmax_xent_bwd kernel");
  return -1;
}

int64_t embedding_gather(const CudaArray& weight, const CudaArray& ids, int64_t vocab,
                         int64_t cols, int64_t rows, CudaArray* out) {
  const int64_t bad = first_bad_id(ids, rows, vocab);
  if (bad >= 0 || rows * cols == 0) return bad;
  embedding_gather_kernel<<<grid_for(rows * cols), BLOCK>>>(weight.ptr, ids.ptr, cols, rows,
                                                            out->ptr);
  check_launch("embedding_gather kernel");
  return -1;
}

int64_t embedding_scatter_add(const CudaArray& grad, const CudaArray& ids, int64_t rows,
                              int64_t cols, int64_t vocab, CudaArray* out) {
  const int64_t bad = first_bad_id(ids, rows, vocab);
  if (bad >= 0) return bad;
  if (vocab * cols > 0) {
    fill_kernel<<<grid_for(vocab * cols), BLOCK>>>(out->ptr, 0.f, vocab * cols);
    check_launch("fill kernel");
  }
  if (rows * cols > 0) {
    embedding_scatter_add_kernel<<<grid_for(rows * cols), BLOCK>>>(grad.ptr, ids.ptr, cols, rows,
                                                                   out->ptr);
    check_launch("embedding_scatter_add kernel");
  }
  return -1;
}

void layernorm_fwd(const CudaArray& x, const CudaArray& w, const CudaArray& b, int64_t rows,
                   int64_t cols, float eps, CudaArray* y, CudaArray* xhat, CudaArray* rstd) {
  if (rows == 0) return;
  layernorm_fwd_kernel<<<grid_for(rows, 1), row_threads(cols)>>>(
      x.ptr, w.ptr, b.ptr, rows, cols, eps, y->ptr, xhat->ptr, rstd->ptr);
  check_launch("layernorm_fwd kernel");
}

void layernorm_bwd(const CudaArray& dy, const CudaArray& xhat, const CudaArray& rstd,
                   const CudaArray& w, int64_t rows, int64_t cols, CudaArray* dx, CudaArray* dw,
                   CudaArray* db) {
  if (rows > 0 && cols > 0) {
    layernorm_bwd_kernel<<<grid_for(rows, 1), row_threads(cols)>>>(dy.ptr, xhat.ptr, rstd.ptr,
                                                                   w.ptr, rows, cols, dx->ptr);
    check_launch("layernorm_bwd kernel");
  }
  if (cols > 0) {
    column_grads_kernel<<<column_grid(cols), dim3(COL_X, COL_Y)>>>(dy.ptr, xhat.ptr, rows, cols,
                                                                   dw->ptr, db->ptr);
    check_launch("layernorm_bwd column kernel");
  }
}

void batchnorm_fwd(const CudaArray& x, const CudaArray& w, const CudaArray& b, int64_t rows,
                   int64_t cols, float eps, CudaArray* y, CudaArray* xhat, CudaArray* rstd,
                   CudaArray* mean, CudaArray* var) {
  if (cols == 0) return;
  batchnorm_fwd_kernel<<<column_grid(cols), dim3(COL_X, COL_Y)>>>(
      x.ptr, w.ptr, b.ptr, rows, cols, eps, y->ptr, xhat->ptr, rstd->ptr, mean->ptr, var->ptr);
  check_launch("batchnorm_fwd kernel");
}

void batchnorm_bwd(const CudaArray& dy, const CudaArray& xhat, const CudaArray& rstd,
                   const CudaArray& w, int64_t rows, int64_t cols, CudaArray* dx, CudaArray* dw,
                   CudaArray* db) {
  if (cols == 0) return;
  batchnorm_bwd_kernel<<<column_grid(cols), dim3(COL_X, COL_Y)>>>(
      dy.ptr, xhat.ptr, rstd.ptr, w.ptr, rows, cols, dx->ptr, dw->ptr, db->ptr);
  check_launch("batchnorm_bwd kernel");
}

void lstm_cell_fwd(const CudaArray& gates, const CudaArray& c_prev, int64_t batch,
                   int64_t hidden, CudaArray* h, CudaArray* c, CudaArray* act,
                   CudaArray* tanh_c) {
  if (batch * hidden == 0) return;
  lstm_cell_fwd_kernel<<<grid_for(batch * hidden), BLOCK>>>(
      gates.ptr, nullptr, c_prev.ptr, batch, hidden, h->ptr, c->ptr, act->ptr, tanh_c->ptr);
  check_launch("lstm_cell_fwd kernel");
}

void lstm_cell_bwd(const CudaArray& dh, const CudaArray& dc, const CudaArray& act,
                   const CudaArray& c_prev, const CudaArray& tanh_c, int64_t batch,
                   int64_t hidden, CudaArray* dgates, CudaArray* dc_prev) {
  if (batch * hidden == 0) return;
  lstm_cell_bwd_kernel<<<grid_for(batch * hidden), BLOCK>>>(dh.ptr, nullptr, dc.ptr, act.ptr,
                                                            c_prev.ptr, tanh_c.ptr, nullptr, batch,
                                                            hidden, dgates->ptr, dc_prev->ptr);
  check_launch("lstm_cell_bwd kernel");
}

namespace {
void copy_device(float* dst, const float* src, int64_t n) {
  if (n > 0)
    check(cudaMemcpy(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice),
          "cudaMemcpy device to device");
}
}  // namespace

// The layer's loop on the host, two launches a step: the product h_{t-1} @ w_hh written into
// act[t] (matrix t of act), then the cell kernel adding xw[t], turning act[t] into activations
// in place and updating c in place. Only act and out are kept for the backward pass.
void lstm_layer_fwd(const CudaArray& xw, const CudaArray& h0, const CudaArray& c0,
                    const CudaArray& w_hh, int64_t batch, int64_t hidden, int64_t steps,
                    CudaArray* out, CudaArray* h, CudaArray* c, CudaArray* act) {
  const int64_t H = hidden, n = batch * hidden, n4 = 4 * n;
  if (n == 0) return;
  copy_device(c->ptr, c0.ptr, n);
  for (int64_t t = 0; t < steps; ++t) {
    const CudaArray& h_prev = t ? *out : h0;
    const MatrixView vh{t ? (t - 1) * n : 0, 0, H, 1}, vw{0, 0, 4 * H, 1};
    matmul(h_prev, w_hh, act, {MatmulGroup{vh, vw, t, 1}}, batch, H, 4 * H);
    lstm_cell_fwd_kernel<<<grid_for(n), BLOCK>>>(act->ptr + t * n4, xw.ptr + t * n4, c->ptr,
                                                 batch, H, out->ptr + t * n, c->ptr,
                                                 act->ptr + t * n4, nullptr);
    check_launch("lstm_cell_fwd kernel");
  }
  copy_device(h->ptr, steps ? out->ptr + (steps - 1) * n : h0.ptr, n);
}

// Backward: the cell states recomputed from act (one launch), then two launches a step: the
// cell's gradient (dh0 + d_out[t] as the adjoint of h_t; dc0 carries that of c_t) into dxw[t],
// and dh0 = dxw[t] @ w_hhᵀ (a transposed view); then dw_hh = h_prevᵀ @ dxw over the stacked
// states (h0, out[0], ..., out[T-2]).
void lstm_layer_bwd(const CudaArray& d_out, const CudaArray& dh, const CudaArray& dc,
                    const CudaArray& act, const CudaArray& out, const CudaArray& h0,
                    const CudaArray& c0, const CudaArray& w_hh, int64_t batch, int64_t hidden,
                    int64_t steps, CudaArray* dxw, CudaArray* dh0, CudaArray* dc0,
                    CudaArray* dw_hh) {
  const int64_t H = hidden, n = batch * hidden, n4 = 4 * n;
  copy_device(dh0->ptr, dh.ptr, n);
  copy_device(dc0->ptr, dc.ptr, n);
  if (n == 0 || steps == 0) {
    if (dw_hh->size) {
      fill_kernel<<<grid_for(dw_hh->size), BLOCK>>>(dw_hh->ptr, 0.f, dw_hh->size);
      check_launch("fill kernel");
    }
    return;
  }
  CudaArray c_all(steps * n);
  lstm_cell_states_kernel<<<grid_for(n), BLOCK>>>(act.ptr, c0.ptr, batch, H, steps, c_all.ptr);
  check_launch("lstm_cell_states kernel");
  for (int64_t t = steps - 1; t >= 0; --t) {
    const float* c_prev = t ? c_all.ptr + (t - 1) * n : c0.ptr;
    lstm_cell_bwd_kernel<<<grid_for(n), BLOCK>>>(dh0->ptr, d_out.ptr + t * n, dc0->ptr,
                                                 act.ptr + t * n4, c_prev, nullptr,
                                                 c_all.ptr + t * n, batch, H, dxw->ptr + t * n4,
                                                 dc0->ptr);
    check_launch("lstm_cell_bwd kernel");
    const MatrixView vg{t * n4, 0, 4 * H, 1}, vw_t{0, 0, 1, 4 * H};
    matmul(*dxw, w_hh, dh0, {MatmulGroup{vg, vw_t, 0, 1}}, batch, 4 * H, H);
  }
  // c_all's buffer holds the stacked states h_prev now
  copy_device(c_all.ptr, h0.ptr, n);
  copy_device(c_all.ptr + n, out.ptr, (steps - 1) * n);
  matmul(c_all, MatrixView{0, 0, 1, H}, *dxw, MatrixView{0, 0, 4 * H, 1}, dw_hh, 1, H,
         steps * batch, 4 * H);
}

void sgd_update(CudaArray* param, const CudaArray& grad, CudaArray* buf, float lr,
                float momentum, float weight_decay) {
  if (param->size == 0) return;
  sgd_kernel<<<grid_for(param->size), BLOCK>>>(param->ptr, grad.ptr, buf->ptr, param->size, lr,
                                               momentum, weight_decay);
  check_launch("sgd_update kernel");
}

void adam_update(CudaArray* param, const CudaArray& grad, CudaArray* m, CudaArray* v, float lr,
                 float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2) {
  if (param->size == 0) return;
  adam_kernel<<<grid_for(param->size), BLOCK>>>(param->ptr, grad.ptr, m->ptr, v->ptr,
                                                param->size, lr, beta1, beta2, eps, weight_decay,
                                                bc1, bc2);
  check_launch("adam_update kernel");
}

// ---- convolution --------------------------------------------------------------------------------
// Row (b, i, j) of the im2col matrix (rows x depth, depth = kh*kw*c_in in (kh, kw, c) order) is
// the zero-padded window of x at (i*stride, j*stride); one thread per matrix element.
__global__ void im2col_kernel(const float* x, float* cols, needle::checks::ConvGeometry g) {
  const int64_t depth = g.kh * g.kw * g.cin;
  NEEDLE_GRID_LOOP(idx, g.n * g.ho * g.wo * depth) {
    const int64_t r = idx / depth, d = idx % depth;
    const int64_t c = d % g.cin, kw = (d / g.cin) % g.kw, kh = d / (g.cin * g.kw);
    const int64_t j = r % g.wo, i = (r / g.wo) % g.ho, b = r / (g.wo * g.ho);
    const int64_t y = i * g.stride - g.padding + kh, xx = j * g.stride - g.padding + kw;
    cols[idx] = (y >= 0 && y < g.h && xx >= 0 && xx < g.w) ? x[((b * g.h + y) * g.w + xx) * g.cin + c]
                                                             : 0.0f;
  }
}

// dx (n, h, w, c_in) from the column gradients: one thread per input element sums the entries
// of the windows and offsets that read it (a gather: no atomics, the same sum every run).
__global__ void col2im_kernel(const float* dcols, float* dx, needle::checks::ConvGeometry g) {
  const int64_t depth = g.kh * g.kw * g.cin;
  NEEDLE_GRID_LOOP(idx, g.n * g.h * g.w * g.cin) {
    const int64_t c = idx % g.cin, xx = (idx / g.cin) % g.w, y = (idx / (g.cin * g.w)) % g.h;
    const int64_t b = idx / (g.cin * g.w * g.h);
    float acc = 0.0f;
    for (int64_t kh = 0; kh < g.kh; ++kh) {
      const int64_t ti = y + g.padding - kh;
      if (ti < 0 || ti % g.stride || ti / g.stride >= g.ho) continue;
      for (int64_t kw = 0; kw < g.kw; ++kw) {
        const int64_t tj = xx + g.padding - kw;
        if (tj < 0 || tj % g.stride || tj / g.stride >= g.wo) continue;
        const int64_t r = (b * g.ho + ti / g.stride) * g.wo + tj / g.stride;
        acc += dcols[r * depth + (kh * g.kw + kw) * g.cin + c];
      }
    }
    dx[idx] = acc;
  }
}

namespace {
void im2col(const CudaArray& x, const needle::checks::ConvGeometry& g, CudaArray* cols) {
  if (cols->size == 0) return;
  im2col_kernel<<<grid_for(cols->size), BLOCK>>>(x.ptr, cols->ptr, g);
  check_launch("im2col kernel");
}
}  // namespace

void conv_fwd(const CudaArray& x, const CudaArray& weight, const needle::checks::ConvGeometry& g,
              CudaArray* out) {
  const int64_t rows = g.rows(), depth = g.depth();
  CudaArray cols(rows * depth);
  im2col(x, g, &cols);
  matmul(cols, MatrixView{0, 0, depth, 1}, weight, MatrixView{0, 0, g.cout, 1}, out, 1, rows,
         depth, g.cout);
}

void conv_weight_grad(const CudaArray& x, const CudaArray& grad,
                      const needle::checks::ConvGeometry& g, CudaArray* out) {
  const int64_t rows = g.rows(), depth = g.depth();
  CudaArray cols(rows * depth);
  im2col(x, g, &cols);
  matmul(cols, MatrixView{0, 0, 1, depth}, grad, MatrixView{0, 0, g.cout, 1}, out, 1, depth, rows,
         g.cout);
}

void conv_input_grad(const CudaArray& grad, const CudaArray& weight,
                     const needle::checks::ConvGeometry& g, CudaArray* out) {
  const int64_t rows = g.rows(), depth = g.depth();
  if (out->size == 0) return;
  CudaArray dcols(rows * depth);
  matmul(grad, MatrixView{0, 0, g.cout, 1}, weight, MatrixView{0, 0, 1, g.cout}, &dcols, 1, rows,
         g.cout, depth);
  col2im_kernel<<<grid_for(out->size), BLOCK>>>(dcols.ptr, out->ptr, g);
  check_launch("col2im kernel");
}

}  // namespace needle::cuda
