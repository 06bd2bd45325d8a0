// The CUDA device module of needle's NDArray: declarations shared by the kernels
// (ndarray_backend_cuda.cu, compiled by nvcc) and the pybind11 bindings
// (ndarray_backend_cuda_module.cc, compiled by the C++ compiler).
//
// The host functions declared here trust their arguments: every size, shape, stride and
// offset is validated by the bindings before they are called. CUDA failures are thrown as
// std::runtime_error (pybind11 turns them into Python RuntimeError).
#pragma once

#include <cstddef>
#include <cstdint>

namespace needle {
namespace cuda {

// Most dimensions a strided view may have (shape and strides travel to the kernels by value).
constexpr int MAX_DIMS = 16;
// The course's tile size; the CUDA module has no matmul_tiled, so NDArray never tiles for it.
constexpr int TILE = 4;

// A flat float32 buffer in device memory (cudaMalloc'd, freed in the destructor).
struct CudaArray {
  explicit CudaArray(size_t size);
  ~CudaArray();
  CudaArray(const CudaArray&) = delete;
  CudaArray& operator=(const CudaArray&) = delete;

  float* ptr = nullptr;
  size_t size = 0;
};

// A strided view over a buffer: element (i_0, .., i_{ndim-1}) lives at
// offset + sum_k i_k * strides[k] (in elements; strides may be 0 or negative).
struct StridedView {
  int ndim = 0;
  int64_t shape[MAX_DIMS] = {};
  int64_t strides[MAX_DIMS] = {};
  int64_t offset = 0;
  size_t size = 1;  // product of shape
};

// Device queries. is_available(): a CUDA device is visible and the driver works.
bool is_available();
int device_count();
void synchronize();

// Memory movement. to_host writes the view's size elements, row-major, to host memory dst.
void to_host(const CudaArray& a, const StridedView& view, float* dst);
void from_host(const float* src, CudaArray* out);  // copies out->size elements
void fill(CudaArray* out, float val);

// Strided copies: compact gathers the view of a into out; ewise_setitem scatters compact a
// into the view of out; scalar_setitem writes val at every element of the view of out.
void compact(const CudaArray& a, CudaArray* out, const StridedView& view);
void ewise_setitem(const CudaArray& a, CudaArray* out, const StridedView& view);
void scalar_setitem(float val, CudaArray* out, const StridedView& view);

// Element-wise ops over out->size elements of compact buffers.
enum class BinaryOp { Add, Mul, Div, Power, Maximum, Eq, Ge };
enum class UnaryOp { Log, Exp, Tanh };
void ewise_binary(BinaryOp op, const CudaArray& a, const CudaArray& b, CudaArray* out);
void scalar_binary(BinaryOp op, const CudaArray& a, float val, CudaArray* out);
void ewise_unary(UnaryOp op, const CudaArray& a, CudaArray* out);

// out (m, p) = a (m, n) @ b (n, p), all compact row-major; m, n, p fit in int32.
void matmul(const CudaArray& a, const CudaArray& b, CudaArray* out, int64_t m, int64_t n,
            int64_t p);

// out[i] = max / sum of a[i * reduce_size .. (i + 1) * reduce_size) for i < out->size;
// reduce_size >= 1.
void reduce_max(const CudaArray& a, CudaArray* out, size_t reduce_size);
void reduce_sum(const CudaArray& a, CudaArray* out, size_t reduce_size);

}  // namespace cuda
}  // namespace needle
