// CUDA kernels and their host launchers for needle's NDArray (the device protocol of API.md §8).
// The pybind11 bindings live in ndarray_backend_cuda_module.cc; they validate every argument
// before calling in here. Every CUDA call is checked and failures are thrown as
// std::runtime_error carrying cudaGetErrorString.
#include "ndarray_backend_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace needle {
namespace cuda {
namespace {

constexpr int BLOCK = 256;
// Grid-stride loops cover what a grid of this many blocks does not.
constexpr size_t MAX_BLOCKS = 65535;

void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) {
    // Clear the (non-sticky) error so that the next launch check does not report it again.
    (void)cudaGetLastError();
    throw std::runtime_error("CUDA error in " + what + ": " + cudaGetErrorString(err));
  }
}

void check_launch(const char* kernel) { check(cudaGetLastError(), std::string(kernel) + " launch"); }

unsigned grid_for(size_t n) {
  return static_cast<unsigned>(std::min((n + BLOCK - 1) / BLOCK, MAX_BLOCKS));
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

// ---- strided views -----------------------------------------------------------------------------

// Shape and strides as a kernel argument (by value). Size-1 dimensions are dropped and
// dimensions that step contiguously over each other are merged, so kernels divide less.
struct KernelView {
  int ndim;
  int64_t shape[MAX_DIMS];
  int64_t strides[MAX_DIMS];
  int64_t offset;
};

KernelView simplify(const StridedView& v) {
  KernelView d{};
  d.offset = v.offset;
  for (int k = 0; k < v.ndim; ++k) {
    if (v.shape[k] == 1) continue;
    if (d.ndim > 0 && d.strides[d.ndim - 1] == v.strides[k] * v.shape[k]) {
      // The outer dimension steps exactly over this one: index j = i_outer * n + i_inner.
      d.shape[d.ndim - 1] *= v.shape[k];
      d.strides[d.ndim - 1] = v.strides[k];
    } else {
      d.shape[d.ndim] = v.shape[k];
      d.strides[d.ndim] = v.strides[k];
      ++d.ndim;
    }
  }
  return d;
}

// Buffer index of the i-th element (row-major order) of the view. IdxT is 32-bit when the
// view has fewer than 2^31 elements: 64-bit division is several times slower on the GPU.
template <typename IdxT>
__device__ __forceinline__ int64_t view_index(IdxT i, const KernelView& d) {
  int64_t off = d.offset;
  for (int k = d.ndim - 1; k >= 0; --k) {
    const IdxT n = static_cast<IdxT>(d.shape[k]);
    const IdxT q = i / n;
    off += static_cast<int64_t>(i - q * n) * d.strides[k];
    i = q;
  }
  return off;
}

enum class Copy { Gather, Scatter, Fill };

// Gather: dst[i] = src[view(i)]; Scatter: dst[view(i)] = src[i]; Fill: dst[view(i)] = val.
template <Copy mode, typename IdxT>
__global__ void strided_kernel(const float* src, float* dst, float val, size_t n, KernelView d) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int64_t j = view_index<IdxT>(static_cast<IdxT>(i), d);
    if (mode == Copy::Gather) {
      dst[i] = src[j];
    } else if (mode == Copy::Scatter) {
      dst[j] = src[i];
    } else {
      dst[j] = val;
    }
  }
}

template <Copy mode>
void launch_strided(const float* src, float* dst, float val, const StridedView& v) {
  if (v.size == 0) return;
  const KernelView d = simplify(v);
  if (v.size <= static_cast<size_t>(INT32_MAX)) {
    strided_kernel<mode, uint32_t><<<grid_for(v.size), BLOCK>>>(src, dst, val, v.size, d);
  } else {
    strided_kernel<mode, uint64_t><<<grid_for(v.size), BLOCK>>>(src, dst, val, v.size, d);
  }
  check_launch("strided copy kernel");
}

__global__ void fill_kernel(float* out, float val, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = val;
  }
}

// ---- element-wise ops --------------------------------------------------------------------------

// numpy's maximum: NaN in either operand gives NaN.
__device__ __forceinline__ float max_nan(float a, float b) { return (a != a || a > b) ? a : b; }

struct AddOp { __device__ float operator()(float a, float b) const { return a + b; } };
struct MulOp { __device__ float operator()(float a, float b) const { return a * b; } };
struct DivOp { __device__ float operator()(float a, float b) const { return a / b; } };
struct PowOp { __device__ float operator()(float a, float b) const { return powf(a, b); } };
struct MaxOp { __device__ float operator()(float a, float b) const { return max_nan(a, b); } };
struct EqOp { __device__ float operator()(float a, float b) const { return a == b ? 1.f : 0.f; } };
struct GeOp { __device__ float operator()(float a, float b) const { return a >= b ? 1.f : 0.f; } };
struct LogOp { __device__ float operator()(float a) const { return logf(a); } };
struct ExpOp { __device__ float operator()(float a) const { return expf(a); } };
struct TanhOp { __device__ float operator()(float a) const { return tanhf(a); } };

template <class Op>
__global__ void ewise_kernel(const float* a, const float* b, float* out, size_t n, Op op) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = op(a[i], b[i]);
  }
}

template <class Op>
__global__ void scalar_kernel(const float* a, float val, float* out, size_t n, Op op) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = op(a[i], val);
  }
}

template <class Op>
__global__ void unary_kernel(const float* a, float* out, size_t n, Op op) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = op(a[i]);
  }
}

// b == nullptr: scalar form with val.
template <class Op>
void launch_binary(Op op, const float* a, const float* b, float val, float* out, size_t n) {
  if (n == 0) return;
  if (b != nullptr) {
    ewise_kernel<<<grid_for(n), BLOCK>>>(a, b, out, n, op);
  } else {
    scalar_kernel<<<grid_for(n), BLOCK>>>(a, val, out, n, op);
  }
  check_launch("element-wise kernel");
}

void binary(BinaryOp op, const float* a, const float* b, float val, float* out, size_t n) {
  switch (op) {
    case BinaryOp::Add: return launch_binary(AddOp{}, a, b, val, out, n);
    case BinaryOp::Mul: return launch_binary(MulOp{}, a, b, val, out, n);
    case BinaryOp::Div: return launch_binary(DivOp{}, a, b, val, out, n);
    case BinaryOp::Power: return launch_binary(PowOp{}, a, b, val, out, n);
    case BinaryOp::Maximum: return launch_binary(MaxOp{}, a, b, val, out, n);
    case BinaryOp::Eq: return launch_binary(EqOp{}, a, b, val, out, n);
    case BinaryOp::Ge: return launch_binary(GeOp{}, a, b, val, out, n);
  }
  throw std::invalid_argument("unknown binary op");
}

// ---- matmul ------------------------------------------------------------------------------------

// C (M, P) = A (M, N) @ B (N, P), row-major. Each block computes a BM x BN tile of C: it stages
// BM x BK tiles of A (stored transposed, padded against bank conflicts) and BK x BN tiles of B
// through shared memory, and each thread accumulates a TM x TN block of outputs in registers.
// A thread's outputs are strided by the thread-grid size (rows ty + i*TY, columns tx + j*TX),
// so a warp's shared-memory reads hit distinct banks or broadcast, and its stores coalesce.
// Out-of-range elements load as 0 and are not stored, so any M, N, P work.
template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
matmul_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
              int M, int N, int P, int tiles_p) {
  constexpr int TX = BN / TN;
  constexpr int TY = BM / TM;
  constexpr int THREADS = TX * TY;
  static_assert((BM * BK) % THREADS == 0 && (BK * BN) % THREADS == 0, "tile loads must divide");
  __shared__ float As[BK][BM + 4];
  __shared__ float Bs[BK][BN];

  const int tid = threadIdx.x;
  const int tx = tid % TX;
  const int ty = tid / TX;
  const int row0 = (blockIdx.x / tiles_p) * BM;
  const int col0 = (blockIdx.x % tiles_p) * BN;

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
      const int r = idx / BK, c = idx % BK;
      const int gr = row0 + r, gc = k0 + c;
      As[c][r] = (gr < M && gc < N) ? A[static_cast<size_t>(gr) * N + gc] : 0.f;
    }
#pragma unroll
    for (int l = 0; l < (BK * BN) / THREADS; ++l) {
      const int idx = tid + l * THREADS;
      const int r = idx / BN, c = idx % BN;
      const int gr = k0 + r, gc = col0 + c;
      Bs[r][c] = (gr < N && gc < P) ? B[static_cast<size_t>(gr) * P + gc] : 0.f;
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

#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int r = row0 + ty + i * TY;
    if (r >= M) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int c = col0 + tx + j * TX;
      if (c < P) C[static_cast<size_t>(r) * P + c] = acc[i][j];
    }
  }
}

template <int BM, int BN, int BK, int TM, int TN>
void launch_matmul(const float* a, const float* b, float* out, int m, int n, int p) {
  const size_t tiles_m = (static_cast<size_t>(m) + BM - 1) / BM;
  const size_t tiles_p = (static_cast<size_t>(p) + BN - 1) / BN;
  const size_t blocks = tiles_m * tiles_p;
  if (blocks > static_cast<size_t>(INT32_MAX)) {
    throw std::invalid_argument("matmul: output of " + std::to_string(m) + " x " +
                                std::to_string(p) + " needs too many thread blocks");
  }
  matmul_kernel<BM, BN, BK, TM, TN><<<static_cast<unsigned>(blocks), (BM / TM) * (BN / TN)>>>(
      a, b, out, m, n, p, static_cast<int>(tiles_p));
  check_launch("matmul kernel");
}

// ---- reductions --------------------------------------------------------------------------------

struct MaxReduce {
  __device__ static float identity() { return -INFINITY; }
  __device__ float operator()(float a, float b) const { return max_nan(a, b); }
};
struct SumReduce {
  __device__ static float identity() { return 0.f; }
  __device__ float operator()(float a, float b) const { return a + b; }
};

template <class R>
__device__ __forceinline__ float warp_reduce(float v, R r) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = r(v, __shfl_down_sync(0xffffffffu, v, off));
  return v;
}

// One warp per output: out[row] = reduce(a[row * len .. row * len + len)). For short rows.
template <class R>
__global__ void reduce_warp_kernel(const float* a, float* out, size_t rows, size_t len, R r) {
  const int lane = threadIdx.x & 31;
  const size_t warps_per_block = blockDim.x >> 5;
  // Every lane of a warp has the same row, so the full-mask shuffles see all 32 lanes.
  for (size_t row = blockIdx.x * warps_per_block + (threadIdx.x >> 5); row < rows;
       row += gridDim.x * warps_per_block) {
    const float* p = a + row * len;
    float v = R::identity();
    for (size_t k = lane; k < len; k += 32) v = r(v, p[k]);
    v = warp_reduce(v, r);
    if (lane == 0) out[row] = v;
  }
}

// One block per (row, chunk): out[row * chunks + c] = reduce of chunk c (chunk_len elements)
// of row `row`. Threads accumulate strided elements, then warps and the block reduce as trees.
template <class R>
__global__ void reduce_block_kernel(const float* a, float* out, size_t rows, size_t len,
                                    size_t chunks, size_t chunk_len, R r) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  for (size_t job = blockIdx.x; job < rows * chunks; job += gridDim.x) {
    const size_t row = job / chunks;
    const size_t begin = (job % chunks) * chunk_len;
    const size_t end = begin + chunk_len < len ? begin + chunk_len : len;
    const float* p = a + row * len;
    float v = R::identity();
    for (size_t k = begin + threadIdx.x; k < end; k += blockDim.x) v = r(v, p[k]);
    v = warp_reduce(v, r);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
      v = lane < nwarps ? partial[lane] : R::identity();
      v = warp_reduce(v, r);
      if (lane == 0) out[job] = v;
    }
    __syncthreads();  // partial is reused by the next job
  }
}

template <class R>
void launch_reduce_warp(const float* a, float* out, size_t rows, size_t len, R r) {
  constexpr size_t warps_per_block = BLOCK / 32;
  const size_t blocks = std::min((rows + warps_per_block - 1) / warps_per_block, MAX_BLOCKS);
  reduce_warp_kernel<<<static_cast<unsigned>(blocks), BLOCK>>>(a, out, rows, len, r);
  check_launch("reduce kernel");
}

template <class R>
void reduce(const CudaArray& a, CudaArray* out, size_t len, R r) {
  const size_t rows = out->size;
  if (rows == 0) return;
  if (len <= 1024) {
    launch_reduce_warp(a.ptr, out->ptr, rows, len, r);
    return;
  }
  // Long rows: one block per row; when there are too few rows to fill the GPU, split each
  // row into chunks of at least MIN_CHUNK elements, then reduce the chunks' partial results.
  constexpr size_t MIN_CHUNK = 8192;
  const size_t target_blocks = 4 * static_cast<size_t>(sm_count());
  size_t chunks = 1;
  if (rows < target_blocks) {
    chunks = std::min((target_blocks + rows - 1) / rows, (len + MIN_CHUNK - 1) / MIN_CHUNK);
    chunks = std::max<size_t>(chunks, 1);
  }
  const size_t chunk_len = (len + chunks - 1) / chunks;
  chunks = (len + chunk_len - 1) / chunk_len;  // no empty chunks
  const unsigned blocks = static_cast<unsigned>(std::min(rows * chunks, MAX_BLOCKS));
  if (chunks == 1) {
    reduce_block_kernel<<<blocks, BLOCK>>>(a.ptr, out->ptr, rows, len, chunks, chunk_len, r);
    check_launch("reduce kernel");
    return;
  }
  CudaArray partial(rows * chunks);
  reduce_block_kernel<<<blocks, BLOCK>>>(a.ptr, partial.ptr, rows, len, chunks, chunk_len, r);
  check_launch("reduce kernel");
  launch_reduce_warp(partial.ptr, out->ptr, rows, chunks, r);
}

}  // namespace

// ---- public host functions ---------------------------------------------------------------------

CudaArray::CudaArray(size_t size_) : size(size_) {
  require_device();
  if (size > 0) {
    void* p = nullptr;
    check(cudaMalloc(&p, size * sizeof(float)),
          "cudaMalloc of " + std::to_string(size * sizeof(float)) + " bytes");
    ptr = static_cast<float*>(p);
  }
}

CudaArray::~CudaArray() {
  // A destructor cannot throw; at interpreter exit the runtime may already be unloading.
  if (ptr != nullptr && cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
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

void to_host(const CudaArray& a, const StridedView& view, float* dst) {
  if (view.size == 0) return;
  const KernelView d = simplify(view);
  const size_t bytes = view.size * sizeof(float);
  if (d.ndim == 0 || (d.ndim == 1 && d.strides[0] == 1)) {  // contiguous: copy directly
    check(cudaMemcpy(dst, a.ptr + view.offset, bytes, cudaMemcpyDeviceToHost),
          "cudaMemcpy device to host");
    return;
  }
  CudaArray tmp(view.size);
  launch_strided<Copy::Gather>(a.ptr, tmp.ptr, 0.f, view);
  check(cudaMemcpy(dst, tmp.ptr, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
}

void from_host(const float* src, CudaArray* out) {
  if (out->size == 0) return;
  check(cudaMemcpy(out->ptr, src, out->size * sizeof(float), cudaMemcpyHostToDevice),
        "cudaMemcpy host to device");
}

void fill(CudaArray* out, float val) {
  if (out->size == 0) return;
  fill_kernel<<<grid_for(out->size), BLOCK>>>(out->ptr, val, out->size);
  check_launch("fill kernel");
}

void compact(const CudaArray& a, CudaArray* out, const StridedView& view) {
  launch_strided<Copy::Gather>(a.ptr, out->ptr, 0.f, view);
}

void ewise_setitem(const CudaArray& a, CudaArray* out, const StridedView& view) {
  launch_strided<Copy::Scatter>(a.ptr, out->ptr, 0.f, view);
}

void scalar_setitem(float val, CudaArray* out, const StridedView& view) {
  launch_strided<Copy::Fill>(nullptr, out->ptr, val, view);
}

void ewise_binary(BinaryOp op, const CudaArray& a, const CudaArray& b, CudaArray* out) {
  binary(op, a.ptr, b.ptr, 0.f, out->ptr, out->size);
}

void scalar_binary(BinaryOp op, const CudaArray& a, float val, CudaArray* out) {
  binary(op, a.ptr, nullptr, val, out->ptr, out->size);
}

void ewise_unary(UnaryOp op, const CudaArray& a, CudaArray* out) {
  const size_t n = out->size;
  if (n == 0) return;
  switch (op) {
    case UnaryOp::Log: unary_kernel<<<grid_for(n), BLOCK>>>(a.ptr, out->ptr, n, LogOp{}); break;
    case UnaryOp::Exp: unary_kernel<<<grid_for(n), BLOCK>>>(a.ptr, out->ptr, n, ExpOp{}); break;
    case UnaryOp::Tanh: unary_kernel<<<grid_for(n), BLOCK>>>(a.ptr, out->ptr, n, TanhOp{}); break;
  }
  check_launch("element-wise kernel");
}

void matmul(const CudaArray& a, const CudaArray& b, CudaArray* out, int64_t m, int64_t n,
            int64_t p) {
  if (m == 0 || p == 0) return;
  if (n == 0) {
    fill(out, 0.f);
    return;
  }
  const int M = static_cast<int>(m), N = static_cast<int>(n), P = static_cast<int>(p);
  // Large outputs: 128x128 tiles, 8x8 per thread. Otherwise 64x64 tiles, 4x4 per thread, so
  // that more blocks keep the multiprocessors busy.
  const size_t big_tiles = ((m + 127) / 128) * ((p + 127) / 128);
  if (big_tiles >= 2 * static_cast<size_t>(sm_count())) {
    launch_matmul<128, 128, 8, 8, 8>(a.ptr, b.ptr, out->ptr, M, N, P);
  } else {
    launch_matmul<64, 64, 8, 4, 4>(a.ptr, b.ptr, out->ptr, M, N, P);
  }
}

void reduce_max(const CudaArray& a, CudaArray* out, size_t reduce_size) {
  reduce(a, out, reduce_size, MaxReduce{});
}

void reduce_sum(const CudaArray& a, CudaArray* out, size_t reduce_size) {
  reduce(a, out, reduce_size, SumReduce{});
}

}  // namespace cuda
}  // namespace needle
