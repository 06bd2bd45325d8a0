// needle's compiled CPU device module (hw3), see the module docstring below for the protocol.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "ndarray_backend_cpu_alloc.h"
#include "ndarray_backend_cpu_gemm.h"
#include "ndarray_backend_cpu_math.h"
#include "ndarray_backend_cpu_strided.h"

namespace needle_cpu {

namespace py = pybind11;

// matmul_tiled packs straight from the tile layout only for the engine's tile size.
constexpr idx_t TILE = gemm::kFastTile;
// Element-wise loops and reductions use every thread above this many elements (memory
// bound), or above kParallelMath for the compute-bound ones; threads claim kGrain at a time.
constexpr idx_t kParallelEwise = idx_t(1) << 18;
constexpr idx_t kParallelMath = idx_t(1) << 16;
constexpr idx_t kGrain = idx_t(1) << 15;

using Shape = std::vector<idx_t>;

[[noreturn]] void size_error(const std::string& msg) { throw std::invalid_argument(msg); }

void check_same_size(const char* fn, const AlignedArray& a, const AlignedArray& out) {
  if (a.size != out.size) {
    std::ostringstream s;
    s << fn << ": input has " << a.size << " elements but out has " << out.size;
    size_error(s.str());
  }
}

void check_same_size(const char* fn, const AlignedArray& a, const AlignedArray& b,
                     const AlignedArray& out) {
  if (a.size != out.size || b.size != out.size) {
    std::ostringstream s;
    s << fn << ": inputs have " << a.size << " and " << b.size << " elements but out has "
      << out.size;
    size_error(s.str());
  }
}

// ---- memory ---------------------------------------------------------------------------------
py::array_t<float> to_numpy(const AlignedArray& a, const Shape& shape, const Shape& strides,
                            idx_t offset) {
  View v = make_view("to_numpy", shape, strides, offset, a.size);
  py::array_t<float> result(std::vector<py::ssize_t>(shape.begin(), shape.end()));
  if (v.size) {
    float* dst = result.mutable_data();
    py::gil_scoped_release release;
    compact_into(a.ptr, dst, v);
  }
  return result;
}

void from_numpy(py::array_t<float, py::array::c_style | py::array::forcecast> a,
                AlignedArray* out) {
  if (idx_t(a.size()) != out->size) {
    std::ostringstream s;
    s << "from_numpy: numpy array has " << a.size() << " elements but out has " << out->size;
    size_error(s.str());
  }
  if (a.size()) std::memcpy(out->ptr, a.data(), size_t(out->size) * sizeof(float));
}

void fill(AlignedArray* out, float val) {
  float* p = out->ptr;
  parallel_ranges(out->size, kParallelEwise, kGrain,
                  [=](idx_t b, idx_t e) { std::fill(p + b, p + e, val); });
}

void compact(const AlignedArray& a, AlignedArray* out, const Shape& shape, const Shape& strides,
             idx_t offset) {
  View v = make_view("compact", shape, strides, offset, a.size);
  if (v.size != out->size) {
    std::ostringstream s;
    s << "compact: shape " << vec_str(shape) << " has " << v.size << " elements but out has "
      << out->size;
    size_error(s.str());
  }
  if (v.size == 0) return;
  if (a.ptr == out->ptr) {  // an in-place compact of an aliasing view goes through a copy
    std::vector<float> tmp(size_t(v.size));
    compact_into(a.ptr, tmp.data(), v);
    std::memcpy(out->ptr, tmp.data(), tmp.size() * sizeof(float));
    return;
  }
  compact_into(a.ptr, out->ptr, v);
}

void ewise_setitem(const AlignedArray& a, AlignedArray* out, const Shape& shape,
                   const Shape& strides, idx_t offset) {
  View v = make_view("ewise_setitem", shape, strides, offset, out->size);
  if (v.size != a.size) {
    std::ostringstream s;
    s << "ewise_setitem: shape " << vec_str(shape) << " has " << v.size
      << " elements but the source has " << a.size;
    size_error(s.str());
  }
  if (v.size == 0) return;
  if (a.ptr == out->ptr) {  // source and destination share memory: copy the source first
    std::vector<float> tmp(a.ptr, a.ptr + a.size);
    setitem_from(tmp.data(), out->ptr, v);
    return;
  }
  setitem_from(a.ptr, out->ptr, v);
}

void scalar_setitem(idx_t size, float val, AlignedArray* out, const Shape& shape,
                    const Shape& strides, idx_t offset) {
  View v = make_view("scalar_setitem", shape, strides, offset, out->size);
  if (v.size != size) {
    std::ostringstream s;
    s << "scalar_setitem: size " << size << " does not match shape " << vec_str(shape) << " ("
      << v.size << " elements)";
    size_error(s.str());
  }
  setitem_scalar(val, out->ptr, v);
}

// ---- element-wise ---------------------------------------------------------------------------
// Plain loops over [b, e) that the compiler vectorises; threads take chunks of kGrain above
// kParallelEwise elements (kParallelMath for the compute-bound exp/log/tanh/pow).
template <class F>
void map1(const AlignedArray& a, AlignedArray* out, F f, idx_t threshold = kParallelEwise) {
  const float* x = a.ptr;
  float* o = out->ptr;
  parallel_ranges(out->size, threshold, kGrain, [=](idx_t b, idx_t e) {
    for (idx_t i = b; i < e; ++i) o[i] = f(x[i]);
  });
}

template <class F>
void map2(const AlignedArray& a, const AlignedArray& b, AlignedArray* out, F f) {
  const float* x = a.ptr;
  const float* y = b.ptr;
  float* o = out->ptr;
  parallel_ranges(out->size, kParallelEwise, kGrain, [=](idx_t lo, idx_t hi) {
    for (idx_t i = lo; i < hi; ++i) o[i] = f(x[i], y[i]);
  });
}

// Vector-math functions (f(x, out, n) over arrays): chunks are whole vectors, so only the last
// one has a padded tail.
template <class F>
void map_vector(const AlignedArray& a, AlignedArray* out, F f) {
  const float* x = a.ptr;
  float* o = out->ptr;
  parallel_ranges(out->size, kParallelMath, kGrain, [=](idx_t b, idx_t e) { f(x + b, o + b, e - b); });
}

// NaN-propagating maximum (numpy's np.maximum): a NaN in either operand gives NaN.
inline float nan_max(float x, float y) { return (x >= y || x != x) ? x : y; }

#define NEEDLE_EWISE(name, expr)                                                  \
  void ewise_##name(const AlignedArray& a, const AlignedArray& b, AlignedArray* out) { \
    check_same_size("ewise_" #name, a, b, *out);                                  \
    map2(a, b, out, [](float x, float y) { return expr; });                       \
  }                                                                               \
  void scalar_##name(const AlignedArray& a, float val, AlignedArray* out) {       \
    check_same_size("scalar_" #name, a, *out);                                    \
    map1(a, out, [val](float x) { const float y = val; return expr; });          \
  }

NEEDLE_EWISE(add, x + y)
NEEDLE_EWISE(mul, x * y)
NEEDLE_EWISE(div, x / y)
NEEDLE_EWISE(maximum, nan_max(x, y))
NEEDLE_EWISE(eq, x == y ? 1.0f : 0.0f)
NEEDLE_EWISE(ge, x >= y ? 1.0f : 0.0f)
#undef NEEDLE_EWISE

void scalar_power(const AlignedArray& a, float val, AlignedArray* out) {
  check_same_size("scalar_power", a, *out);
  // numpy's fast paths for these exponents give exactly these results.
  if (val == 2.0f) return map1(a, out, [](float x) { return x * x; });
  if (val == 1.0f) return map1(a, out, [](float x) { return x; });
  if (val == 0.5f) return map1(a, out, [](float x) { return std::sqrt(x); });
  if (val == -1.0f) return map1(a, out, [](float x) { return 1.0f / x; });
  if (val == 0.0f) return map1(a, out, [](float) { return 1.0f; });
  map1(a, out, [val](float x) { return std::pow(x, val); }, kParallelMath);
}

void ewise_log(const AlignedArray& a, AlignedArray* out) {
  check_same_size("ewise_log", a, *out);
  map_vector(a, out, vmath::log_array);
}

void ewise_exp(const AlignedArray& a, AlignedArray* out) {
  check_same_size("ewise_exp", a, *out);
  map_vector(a, out, vmath::exp_array);
}

void ewise_tanh(const AlignedArray& a, AlignedArray* out) {
  check_same_size("ewise_tanh", a, *out);
  map_vector(a, out, vmath::tanh_array);
}

// ---- matmul ---------------------------------------------------------------------------------
bool overlaps(const AlignedArray& x, const AlignedArray& y) {
  return x.ptr < y.ptr + std::max<idx_t>(y.size, 1) && y.ptr < x.ptr + std::max<idx_t>(x.size, 1);
}

void check_matmul(const char* fn, const AlignedArray& a, const AlignedArray& b,
                  const AlignedArray& out, idx_t m, idx_t n, idx_t p) {
  if (m < 0 || n < 0 || p < 0) {
    std::ostringstream s;
    s << fn << ": sizes must be non-negative, got m=" << m << ", n=" << n << ", p=" << p;
    size_error(s.str());
  }
  auto need = [&](const char* what, const AlignedArray& x, __int128 count) {
    if (count > x.size) {
      std::ostringstream s;
      s << fn << ": " << what << " needs " << idx_t(std::min<__int128>(count, INT64_MAX))
        << " elements for m=" << m << ", n=" << n << ", p=" << p << " but has " << x.size;
      size_error(s.str());
    }
  };
  need("a", a, __int128(m) * n);
  need("b", b, __int128(n) * p);
  need("out", out, __int128(m) * p);
}

// Runs `body(out_ptr)` on out directly, or on a scratch buffer copied back when out shares
// memory with an input.
template <class F>
void with_output(const AlignedArray& a, const AlignedArray& b, AlignedArray* out, idx_t count,
                 F body) {
  if (!overlaps(*out, a) && !overlaps(*out, b)) return body(out->ptr);
  AlignedArray tmp(count);
  body(tmp.ptr);
  std::memcpy(out->ptr, tmp.ptr, size_t(count) * sizeof(float));
}

void matmul(const AlignedArray& a, const AlignedArray& b, AlignedArray* out, idx_t m, idx_t n,
            idx_t p) {
  check_matmul("matmul", a, b, *out, m, n, p);
  with_output(a, b, out, m * p, [&](float* c) {
    if (n == 0) return std::fill(c, c + m * p, 0.0f);
    gemm::gemm(m, n, p, gemm::row_major(a.ptr, n), gemm::row_major(b.ptr, p),
               gemm::row_major(c, p));
  });
}

void matmul_tiled(const AlignedArray& a, const AlignedArray& b, AlignedArray* out, idx_t m,
                  idx_t n, idx_t p) {
  check_matmul("matmul_tiled", a, b, *out, m, n, p);
  if (m % TILE || n % TILE || p % TILE) {
    std::ostringstream s;
    s << "matmul_tiled: m=" << m << ", n=" << n << ", p=" << p << " must be multiples of the tile "
      << "size " << TILE;
    size_error(s.str());
  }
  with_output(a, b, out, m * p, [&](float* c) {
    if (n == 0) return std::fill(c, c + m * p, 0.0f);
    gemm::gemm(m, n, p, gemm::tiled(a.ptr, TILE, n), gemm::tiled(b.ptr, TILE, p),
               gemm::tiled(c, TILE, p));
  });
}

void matmul_naive(const AlignedArray& a, const AlignedArray& b, AlignedArray* out, idx_t m,
                  idx_t n, idx_t p) {
  check_matmul("matmul_naive", a, b, *out, m, n, p);
  with_output(a, b, out, m * p, [&](float* c) { gemm::gemm_naive(m, n, p, a.ptr, b.ptr, c); });
}

// ---- reductions -----------------------------------------------------------------------------
// Sum of x[0:n]: 64 float lanes per block of 4096 elements, blocks added in double; as
// accurate as numpy's pairwise summation, and vectorised.
double sum_range(const float* x, idx_t n) {
  using vmath::vf;
  constexpr idx_t block = 4096;
  double total = 0.0;
  for (idx_t b = 0; b < n; b += block) {
    const idx_t e = std::min(n, b + block);
    vf acc[4] = {};
    idx_t i = b;
    for (; i + 4 * vmath::W <= e; i += 4 * vmath::W)
      for (int u = 0; u < 4; ++u) {
        vf v;
        std::memcpy(&v, x + i + u * vmath::W, sizeof(vf));
        acc[u] += v;
      }
    vf s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    float part = 0.0f;
    for (int t = 0; t < vmath::W; ++t) part += s[t];
    for (; i < e; ++i) part += x[i];
    total += part;
  }
  return total;
}

// Maximum of x[0:n] (n >= 1), NaN if any element is NaN.
float max_range(const float* x, idx_t n) {
  using vmath::vf;
  using vmath::vi;
  idx_t i = 0;
  float m = x[0];
  bool nan = false;
  if (n >= vmath::W) {
    vf acc;
    std::memcpy(&acc, x, sizeof(vf));
    vi isnan = acc != acc;
    for (i = vmath::W; i + vmath::W <= n; i += vmath::W) {
      vf v;
      std::memcpy(&v, x + i, sizeof(vf));
      acc = v > acc ? v : acc;
      isnan |= v != v;
    }
    for (int t = 0; t < vmath::W; ++t) {
      m = std::max(m, acc[t]);
      nan = nan || isnan[t];
    }
  }
  for (; i < n; ++i) {
    m = std::max(m, x[i]);
    nan = nan || x[i] != x[i];
  }
  return nan ? NAN : m;
}

void check_reduce(const char* fn, const AlignedArray& a, const AlignedArray& out, idx_t rs) {
  if (rs <= 0) size_error(std::string(fn) + ": reduce_size must be positive, got " + std::to_string(rs));
  if (__int128(out.size) * rs > a.size) {
    std::ostringstream s;
    s << fn << ": out has " << out.size << " elements, reducing " << rs << " each needs "
      << idx_t(std::min<__int128>(__int128(out.size) * rs, INT64_MAX)) << " but a has " << a.size;
    size_error(s.str());
  }
}

// out[j] = part(a[j*rs : (j+1)*rs]). Threads split the outputs when there are many, or the
// elements of each output when there are few (partial results joined in chunk order).
template <class Part, class Join>
void reduce(const AlignedArray& a, AlignedArray* out, idx_t rs, Part part, Join join) {
  const idx_t nout = out->size;
  if (nout >= 4 * max_threads() || nout * rs < kParallelEwise) {
    parallel_ranges(nout, std::max<idx_t>(1, kParallelEwise / rs), std::max<idx_t>(1, kGrain / rs),
                    [&](idx_t b, idx_t e) {
                      for (idx_t j = b; j < e; ++j) out->ptr[j] = float(part(a.ptr + j * rs, rs));
                    });
    return;
  }
  const idx_t grain = 4 * kGrain, chunks = (rs + grain - 1) / grain;
  std::vector<double> partial(static_cast<size_t>(chunks));
  for (idx_t j = 0; j < nout; ++j) {
    const float* x = a.ptr + j * rs;
    parallel_ranges(rs, kParallelEwise, grain, [&](idx_t b, idx_t e) {
      for (idx_t c = b / grain; c * grain < e; ++c)
        partial[size_t(c)] = part(x + c * grain, std::min(e, (c + 1) * grain) - c * grain);
    });
    double r = partial[0];
    for (idx_t c = 1; c < chunks; ++c) r = join(r, partial[size_t(c)]);
    out->ptr[j] = float(r);
  }
}

void reduce_sum(const AlignedArray& a, AlignedArray* out, idx_t reduce_size) {
  check_reduce("reduce_sum", a, *out, reduce_size);
  if (reduce_size == 1) {
    std::memcpy(out->ptr, a.ptr, size_t(out->size) * sizeof(float));
    return;
  }
  reduce(a, out, reduce_size, [](const float* x, idx_t n) { return sum_range(x, n); },
         [](double x, double y) { return x + y; });
}

void reduce_max(const AlignedArray& a, AlignedArray* out, idx_t reduce_size) {
  check_reduce("reduce_max", a, *out, reduce_size);
  reduce(a, out, reduce_size, [](const float* x, idx_t n) { return double(max_range(x, n)); },
         [](double x, double y) { return (x >= y || x != x) ? x : y; });
}

int num_threads() { return max_threads(); }

}  // namespace needle_cpu

PYBIND11_MODULE(ndarray_backend_cpu, m) {
  namespace py = pybind11;
  using namespace needle_cpu;
  m.doc() = R"doc(needle's compiled CPU device (the device protocol of needle.backend_ndarray).

Buffers are flat, 64-byte aligned float32 ``Array`` objects; shapes, strides (in elements,
may be 0 or negative) and offsets describe strided views of them. Every function checks
sizes and view extents against its buffers and raises ValueError / IndexError (naming the
sizes) rather than touching memory outside them.

Matrix products, C (m, p) = A (m, n) @ B (n, p):
  matmul        row-major operands; the blocked engine (packed panels, a register-blocked
                AVX-512 / AVX2+FMA / portable micro-kernel, threads for large sizes).
  matmul_tiled  the same engine reading and writing the tiled layout NDArray.__matmul__
                builds when m, n, p are multiples of __tile_size__: a is (m/T, n/T, T, T),
                b is (n/T, p/T, T, T), out is (m/T, p/T, T, T), all compact.
  matmul_naive  the textbook (i, j, k) triple loop, for comparison (an extension).
exp, log and tanh use vectorised Cephes polynomials (within 2 ulp of the exact result).

Large kernels (matmul from about 128^3, element-wise ops from about 256K elements, copies from
about 128K)
share their work with a pool of helper threads: OMP_NUM_THREADS threads in all, else one per
CPU (num_threads() says how many). The calling thread always works too and never waits for a
helper that has not started, so a busy machine costs no more than one thread would. In a
child created by fork() everything runs on the calling thread.
)doc";
  install_fork_handler();
  m.attr("__device_name__") = "cpu";
  m.attr("__tile_size__") = TILE;
  m.attr("__matmul_kernel__") = gemm::kKernelName;

  py::class_<AlignedArray>(m, "Array", "A flat float32 buffer of `size` elements.")
      .def(py::init<idx_t>(), py::arg("size"))
      .def("ptr", &AlignedArray::ptr_as_int, "Address of the first element.")
      .def_readonly("size", &AlignedArray::size);

  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("to_numpy", &to_numpy, "A numpy copy of the strided view (shape, strides, offset) of a.",
        py::arg("a"), py::arg("shape"), py::arg("strides"), py::arg("offset"));
  m.def("from_numpy", &from_numpy, "Copy a numpy array (row-major) into out.", py::arg("a"),
        py::arg("out"));
  m.def("fill", &fill, "Set every element of out to val.", py::arg("out"), py::arg("val"), nogil);
  m.def("compact", &compact, "out (row-major) = the strided view of a.", py::arg("a"),
        py::arg("out"), py::arg("shape"), py::arg("strides"), py::arg("offset"), nogil);
  m.def("ewise_setitem", &ewise_setitem, "The strided view of out = compact a.", py::arg("a"),
        py::arg("out"), py::arg("shape"), py::arg("strides"), py::arg("offset"), nogil);
  m.def("scalar_setitem", &scalar_setitem, "The strided view of out (size elements) = val.",
        py::arg("size"), py::arg("val"), py::arg("out"), py::arg("shape"), py::arg("strides"),
        py::arg("offset"), nogil);

  m.def("ewise_add", &ewise_add, nogil);
  m.def("scalar_add", &scalar_add, nogil);
  m.def("ewise_mul", &ewise_mul, nogil);
  m.def("scalar_mul", &scalar_mul, nogil);
  m.def("ewise_div", &ewise_div, nogil);
  m.def("scalar_div", &scalar_div, nogil);
  m.def("scalar_power", &scalar_power, nogil);
  m.def("ewise_maximum", &ewise_maximum, nogil);
  m.def("scalar_maximum", &scalar_maximum, nogil);
  m.def("ewise_eq", &ewise_eq, nogil);
  m.def("scalar_eq", &scalar_eq, nogil);
  m.def("ewise_ge", &ewise_ge, nogil);
  m.def("scalar_ge", &scalar_ge, nogil);
  m.def("ewise_log", &ewise_log, nogil);
  m.def("ewise_exp", &ewise_exp, nogil);
  m.def("ewise_tanh", &ewise_tanh, nogil);

  m.def("matmul", &matmul, "out (m, p) = a (m, n) @ b (n, p), row-major.", py::arg("a"),
        py::arg("b"), py::arg("out"), py::arg("m"), py::arg("n"), py::arg("p"), nogil);
  m.def("matmul_tiled", &matmul_tiled, "out = a @ b in the (rows/T, cols/T, T, T) tiled layout.",
        py::arg("a"), py::arg("b"), py::arg("out"), py::arg("m"), py::arg("n"), py::arg("p"),
        nogil);
  m.def("matmul_naive", &matmul_naive, "out = a @ b by the plain triple loop (row-major).",
        py::arg("a"), py::arg("b"), py::arg("out"), py::arg("m"), py::arg("n"), py::arg("p"),
        nogil);
  m.def("reduce_max", &reduce_max, "out[j] = max of a[j*reduce_size:(j+1)*reduce_size].",
        py::arg("a"), py::arg("out"), py::arg("reduce_size"), nogil);
  m.def("reduce_sum", &reduce_sum, "out[j] = sum of a[j*reduce_size:(j+1)*reduce_size].",
        py::arg("a"), py::arg("out"), py::arg("reduce_size"), nogil);
  m.def("num_threads", &num_threads,
        "Threads the large kernels use: OMP_NUM_THREADS, else one per core (an extension).");
}
