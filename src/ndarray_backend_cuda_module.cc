// pybind11 bindings of needle's CUDA device module (`ndarray_backend_cuda`).
//
// This is the Python/C++ border: every buffer size, shape, stride and offset is validated here
// (bad input raises ValueError naming the problem) before the kernels in
// ndarray_backend_cuda.cu run. CUDA failures arrive as std::runtime_error -> RuntimeError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ndarray_backend_cuda.h"

namespace py = pybind11;

namespace {

using needle::cuda::BinaryOp;
using needle::cuda::CudaArray;
using needle::cuda::StridedView;
using needle::cuda::UnaryOp;
using Ints = std::vector<int64_t>;

// Element counts above this are refused (their byte sizes would overflow).
constexpr int64_t MAX_ELEMENTS = int64_t{1} << 60;
// matmul sizes stay below this so that tile indices never overflow int32 in the kernel.
constexpr int64_t MAX_MATMUL_DIM = (int64_t{1} << 31) - 1024;

std::string tuple_str(const Ints& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  if (v.size() == 1) s += ",";
  return s + ")";
}

std::string i128_str(__int128 v) { return std::to_string(static_cast<long long>(v)); }

// The view (shape, strides, offset) of a buffer of buffer_size elements, checked to stay
// inside the buffer. `what` names the function and the buffer in error messages.
StridedView make_view(const std::string& what, const Ints& shape, const Ints& strides,
                      int64_t offset, size_t buffer_size) {
  if (shape.size() != strides.size()) {
    throw std::invalid_argument(what + ": shape " + tuple_str(shape) + " and strides " +
                                tuple_str(strides) + " differ in length");
  }
  if (shape.size() > static_cast<size_t>(needle::cuda::MAX_DIMS)) {
    throw std::invalid_argument(what + ": a view of " + std::to_string(shape.size()) +
                                " dimensions; the CUDA backend supports at most " +
                                std::to_string(needle::cuda::MAX_DIMS));
  }
  if (offset < 0) {
    throw std::invalid_argument(what + ": negative offset " + std::to_string(offset));
  }
  StridedView v;
  v.ndim = static_cast<int>(shape.size());
  v.offset = offset;
  bool empty = false;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] < 0) {
      throw std::invalid_argument(what + ": negative dimension in shape " + tuple_str(shape));
    }
    empty = empty || shape[k] == 0;
    v.shape[k] = shape[k];
    v.strides[k] = strides[k];
  }
  if (empty) {
    v.size = 0;
    return v;
  }
  __int128 size = 1, lo = offset, hi = offset;
  for (size_t k = 0; k < shape.size(); ++k) {
    size *= shape[k];
    if (size > MAX_ELEMENTS) {
      throw std::invalid_argument(what + ": shape " + tuple_str(shape) + " has too many elements");
    }
    const __int128 extent = static_cast<__int128>(shape[k] - 1) * strides[k];
    (extent > 0 ? hi : lo) += extent;
  }
  if (lo < 0 || hi >= static_cast<__int128>(buffer_size)) {
    throw std::invalid_argument(
        what + ": the view with shape " + tuple_str(shape) + ", strides " + tuple_str(strides) +
        " and offset " + std::to_string(offset) + " reaches elements " + i128_str(lo) + " to " +
        i128_str(hi) + ", outside the buffer of " + std::to_string(buffer_size) + " elements");
  }
  v.size = static_cast<size_t>(size);
  return v;
}

void check_size(const std::string& what, size_t got, size_t expected, const char* expected_of) {
  if (got != expected) {
    throw std::invalid_argument(what + " has " + std::to_string(got) + " elements, expected " +
                                std::to_string(expected) + " (" + expected_of + ")");
  }
}

void check_ewise(const char* fn, const CudaArray& a, const CudaArray* b, const CudaArray& out) {
  const std::string f(fn);
  check_size(f + ": input a", a.size, out.size, "the size of out");
  if (b != nullptr) check_size(f + ": input b", b->size, out.size, "the size of out");
}

// Binds `ewise_name` (out[i] = a[i] OP b[i]) when given, and `scalar_name` (out[i] = a[i] OP val);
// `formula` writes the operation with B standing for the second operand (for the docstrings).
void bind_binary(py::module_& m, const char* ewise_name, const char* scalar_name, BinaryOp op,
                 const std::string& formula) {
  auto doc = [&formula](const std::string& b) {
    std::string f = formula;
    f.replace(f.find('B'), 1, b);
    return "out[i] = " + f + " (compact buffers of one size).";
  };
  if (ewise_name != nullptr) {
    m.def(
        ewise_name,
        [op, ewise_name](const CudaArray& a, const CudaArray& b, CudaArray* out) {
          check_ewise(ewise_name, a, &b, *out);
          needle::cuda::ewise_binary(op, a, b, out);
        },
        py::arg("a"), py::arg("b"), py::arg("out"), doc("b[i]").c_str());
  }
  m.def(
      scalar_name,
      [op, scalar_name](const CudaArray& a, float val, CudaArray* out) {
        check_ewise(scalar_name, a, nullptr, *out);
        needle::cuda::scalar_binary(op, a, val, out);
      },
      py::arg("a"), py::arg("val"), py::arg("out"), doc("val").c_str());
}

void bind_unary(py::module_& m, const char* name, UnaryOp op, const char* what) {
  m.def(
      name,
      [op, name](const CudaArray& a, CudaArray* out) {
        check_ewise(name, a, nullptr, *out);
        needle::cuda::ewise_unary(op, a, out);
      },
      py::arg("a"), py::arg("out"), (std::string("out[i] = ") + what + "(a[i]).").c_str());
}

template <void (*Kernel)(const CudaArray&, CudaArray*, size_t)>
void reduce_checked(const char* fn, const CudaArray& a, CudaArray* out, int64_t reduce_size) {
  const std::string f(fn);
  if (reduce_size < 0) {
    throw std::invalid_argument(f + ": negative reduce_size " + std::to_string(reduce_size));
  }
  const __int128 needed = static_cast<__int128>(out->size) * reduce_size;
  if (needed > static_cast<__int128>(a.size)) {
    throw std::invalid_argument(f + ": " + std::to_string(out->size) + " outputs of " +
                                std::to_string(reduce_size) + " elements need " +
                                i128_str(needed) + ", but the input buffer has " +
                                std::to_string(a.size));
  }
  if (out->size == 0) return;
  if (reduce_size == 0) {
    if (Kernel == &needle::cuda::reduce_max) {
      throw std::invalid_argument(f + ": the max over 0 elements (reduce_size 0) has no identity");
    }
    needle::cuda::fill(out, 0.f);
    return;
  }
  Kernel(a, out, static_cast<size_t>(reduce_size));
}

}  // namespace

PYBIND11_MODULE(ndarray_backend_cuda, m) {
  m.doc() = "needle's CUDA device module: float32 buffers in GPU memory and the kernels of the "
            "NDArray device protocol.";
  m.attr("__device_name__") = "cuda";
  m.attr("__tile_size__") = needle::cuda::TILE;

  py::class_<CudaArray>(m, "Array", "A flat float32 buffer of `size` elements in GPU memory.")
      .def(py::init([](int64_t size) {
             if (size < 0) {
               throw std::invalid_argument("Array size must be non-negative, got " +
                                           std::to_string(size));
             }
             if (size > MAX_ELEMENTS) {
               throw std::invalid_argument("Array size " + std::to_string(size) + " is too large");
             }
             return new CudaArray(static_cast<size_t>(size));
           }),
           py::arg("size"))
      .def_readonly("size", &CudaArray::size, "Number of float32 elements.")
      .def(
          "ptr", [](const CudaArray& a) { return reinterpret_cast<std::uintptr_t>(a.ptr); },
          "Device address of the first element (views of one buffer share it; 0 when empty).");

  m.def("is_available", &needle::cuda::is_available,
        "True when the CUDA runtime sees at least one GPU (cudaGetDeviceCount).");
  m.def("device_count", &needle::cuda::device_count,
        "Number of visible CUDA devices (0 when there is no GPU or driver).");
  m.def("synchronize", &needle::cuda::synchronize,
        "Wait for every queued kernel to finish (for timing); raises on an asynchronous error.");

  m.def(
      "to_numpy",
      [](const CudaArray& a, const Ints& shape, const Ints& strides, int64_t offset) {
        const StridedView v = make_view("to_numpy", shape, strides, offset, a.size);
        py::array_t<float> result(std::vector<py::ssize_t>(shape.begin(), shape.end()));
        if (v.size > 0) needle::cuda::to_host(a, v, result.mutable_data());
        return result;
      },
      py::arg("a"), py::arg("shape"), py::arg("strides"), py::arg("offset"),
      "A numpy copy (shape `shape`) of the strided view (strides in elements) of `a`.");
  m.def(
      "from_numpy",
      [](py::array_t<float, py::array::c_style | py::array::forcecast> a, CudaArray* out) {
        check_size("from_numpy: the numpy array", static_cast<size_t>(a.size()), out->size,
                   "the size of out");
        needle::cuda::from_host(a.data(), out);
      },
      py::arg("a"), py::arg("out"), "Copy the elements of `a` (row-major, as float32) into `out`.");
  m.def("fill", &needle::cuda::fill, py::arg("out"), py::arg("val"),
        "Set every element of `out` to `val`.");

  m.def(
      "compact",
      [](const CudaArray& a, CudaArray* out, const Ints& shape, const Ints& strides,
         int64_t offset) {
        const StridedView v = make_view("compact (input a)", shape, strides, offset, a.size);
        check_size("compact: out", out->size, v.size, "the number of elements of the view");
        needle::cuda::compact(a, out, v);
      },
      py::arg("a"), py::arg("out"), py::arg("shape"), py::arg("strides"), py::arg("offset"),
      "Write the strided view of `a` into `out` in row-major order.");
  m.def(
      "ewise_setitem",
      [](const CudaArray& a, CudaArray* out, const Ints& shape, const Ints& strides,
         int64_t offset) {
        const StridedView v = make_view("ewise_setitem (out)", shape, strides, offset, out->size);
        check_size("ewise_setitem: input a", a.size, v.size, "the number of elements of the view");
        needle::cuda::ewise_setitem(a, out, v);
      },
      py::arg("a"), py::arg("out"), py::arg("shape"), py::arg("strides"), py::arg("offset"),
      "Write compact `a` (row-major) into the strided view of `out`.");
  m.def(
      "scalar_setitem",
      [](int64_t size, float val, CudaArray* out, const Ints& shape, const Ints& strides,
         int64_t offset) {
        const StridedView v = make_view("scalar_setitem (out)", shape, strides, offset, out->size);
        if (size < 0 || static_cast<size_t>(size) != v.size) {
          throw std::invalid_argument("scalar_setitem: size " + std::to_string(size) +
                                      " differs from the " + std::to_string(v.size) +
                                      " elements of the view");
        }
        needle::cuda::scalar_setitem(val, out, v);
      },
      py::arg("size"), py::arg("val"), py::arg("out"), py::arg("shape"), py::arg("strides"),
      py::arg("offset"), "Set every element of the strided view of `out` to `val`.");

  bind_binary(m, "ewise_add", "scalar_add", BinaryOp::Add, "a[i] + B");
  bind_binary(m, "ewise_mul", "scalar_mul", BinaryOp::Mul, "a[i] * B");
  bind_binary(m, "ewise_div", "scalar_div", BinaryOp::Div, "a[i] / B");
  bind_binary(m, nullptr, "scalar_power", BinaryOp::Power, "a[i] ** B");
  bind_binary(m, "ewise_maximum", "scalar_maximum", BinaryOp::Maximum,
              "max(a[i], B), NaN if either is NaN");
  bind_binary(m, "ewise_eq", "scalar_eq", BinaryOp::Eq, "1.0 if a[i] == B else 0.0");
  bind_binary(m, "ewise_ge", "scalar_ge", BinaryOp::Ge, "1.0 if a[i] >= B else 0.0");
  bind_unary(m, "ewise_log", UnaryOp::Log, "log");
  bind_unary(m, "ewise_exp", UnaryOp::Exp, "exp");
  bind_unary(m, "ewise_tanh", UnaryOp::Tanh, "tanh");

  m.def(
      "matmul",
      [](const CudaArray& a, const CudaArray& b, CudaArray* out, int64_t m_, int64_t n,
         int64_t p) {
        for (int64_t s : {m_, n, p}) {
          if (s < 0 || s > MAX_MATMUL_DIM) {
            throw std::invalid_argument("matmul: sizes m, n, p = " + std::to_string(m_) + ", " +
                                        std::to_string(n) + ", " + std::to_string(p) +
                                        " must lie in [0, " + std::to_string(MAX_MATMUL_DIM) +
                                        "]");
          }
        }
        check_size("matmul: a", a.size, static_cast<size_t>(m_ * n), "m * n");
        check_size("matmul: b", b.size, static_cast<size_t>(n * p), "n * p");
        check_size("matmul: out", out->size, static_cast<size_t>(m_ * p), "m * p");
        needle::cuda::matmul(a, b, out, m_, n, p);
      },
      py::arg("a"), py::arg("b"), py::arg("out"), py::arg("m"), py::arg("n"), py::arg("p"),
      "out (m, p) = a (m, n) @ b (n, p), all compact row-major (shared-memory tiled kernel).");
  m.def(
      "reduce_max",
      [](const CudaArray& a, CudaArray* out, int64_t reduce_size) {
        reduce_checked<&needle::cuda::reduce_max>("reduce_max", a, out, reduce_size);
      },
      py::arg("a"), py::arg("out"), py::arg("reduce_size"),
      "out[i] = max of a[i*reduce_size : (i+1)*reduce_size] (NaN propagates).");
  m.def(
      "reduce_sum",
      [](const CudaArray& a, CudaArray* out, int64_t reduce_size) {
        reduce_checked<&needle::cuda::reduce_sum>("reduce_sum", a, out, reduce_size);
      },
      py::arg("a"), py::arg("out"), py::arg("reduce_size"),
      "out[i] = sum of a[i*reduce_size : (i+1)*reduce_size].");
}
