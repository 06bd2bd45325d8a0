// needle's compiled CPU device module: the device protocol of
// needle/backend_ndarray/protocol.py (see the module docstring at the end of this file).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/ndarray_backend_cpu_alloc.h"
#include "cpu/ndarray_backend_cpu_array_type.h"
#include "cpu/ndarray_backend_cpu_attention.h"
#include "cpu/ndarray_backend_cpu_conv.h"
#include "cpu/ndarray_backend_cpu_ewise.h"
#include "cpu/ndarray_backend_cpu_fused.h"
#include "cpu/ndarray_backend_cpu_isa.h"
#include "cpu/ndarray_backend_cpu_lstm.h"
#include "cpu/ndarray_backend_cpu_math.h"
#include "cpu/ndarray_backend_cpu_strided.h"
#include "common/ndarray_attention.h"
#include "common/ndarray_bindings.h"
#include "common/ndarray_checks.h"
#include "common/ndarray_ops.h"

namespace needle::cpu {

namespace py = pybind11;
using Shape = std::vector<idx_t>;
using needle::checks::check_at_least;
using needle::checks::check_op;
using needle::checks::check_size;
using needle::checks::check_sizes;
using needle::checks::check_view;
using needle::checks::fail;

// Kernels on fewer elements than this keep the GIL: releasing and re-taking it costs more
// than they do.
constexpr idx_t kReleaseGil = idx_t(1) << 14;
struct MaybeNoGil {
  std::optional<py::gil_scoped_release> release;
  explicit MaybeNoGil(double work) {
    if (work >= double(kReleaseGil)) release.emplace();
  }
};

// ---- instruction set ------------------------------------------------------------------------
const IsaKernels* g_isa = nullptr;

bool cpu_supports(const IsaKernels* k) {
  if (!k) return false;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const std::string isa = k->config.isa;
  if (isa == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return true;
}

// The variants this CPU can run, best first.
std::vector<const IsaKernels*> available_isas() {
  std::vector<const IsaKernels*> out;
  for (const IsaKernels* k : {isa_kernels_avx512(), isa_kernels_avx2(), isa_kernels_portable()})
    if (cpu_supports(k)) out.push_back(k);
  return out;
}

// The best variant, or the one NEEDLE_CPU_ISA names; an unknown or unsupported name gives a
// RuntimeWarning and the best variant.
void choose_isa() {
  const auto avail = available_isas();
  g_isa = avail.front();
  const char* env = std::getenv("NEEDLE_CPU_ISA");
  if (!env || !*env) return;
  for (const IsaKernels* k : avail)
    if (std::string(env) == k->config.isa) {
      g_isa = k;
      return;
    }
  std::string names;
  for (const IsaKernels* k : avail) names += std::string(names.empty() ? "" : ", ") + k->config.isa;
  PyErr_WarnEx(PyExc_RuntimeWarning,
               ("NEEDLE_CPU_ISA=" + std::string(env) + " is not available on this CPU (choose " +
                "from " + names + "); using " + g_isa->config.isa)
                   .c_str(),
               1);
}

void pool_parallel_for(int64_t n, void (*fn)(void*, int64_t), void* ctx) {
  auto body = [fn, ctx](int64_t i) { fn(ctx, i); };
  parallel_for(n, body);
}
Runner runner() { return Runner{&pool_parallel_for, max_threads()}; }

// ---- memory ---------------------------------------------------------------------------------
py::array_t<float> to_numpy(const AlignedArray& a, const Shape& shape, const Shape& strides,
                            idx_t offset) {
  View v = make_view("to_numpy", shape, strides, offset, a.size);
  py::array_t<float> result(std::vector<py::ssize_t>(shape.begin(), shape.end()));
  if (v.size) {
    float* dst = result.mutable_data();
    MaybeNoGil nogil{double(v.size)};
    compact_into(a.ptr, dst, v);
  }
  return result;
}

void from_numpy(py::array_t<float, py::array::c_style | py::array::forcecast> a,
                AlignedArray* out) {
  check_size("from_numpy", "the numpy array", idx_t(a.size()), out->size);
  if (a.size()) std::memcpy(out->ptr, a.data(), size_t(out->size) * sizeof(float));
}

void fill(AlignedArray* out, float val) {
  float* p = out->ptr;
  MaybeNoGil nogil{double(out->size)};
  parallel_ranges(out->size, kParallelEwise, kEwiseGrain,
                  [=](idx_t b, idx_t e) { std::fill(p + b, p + e, val); });
}

// question: hw3_compact
void compact(const AlignedArray& a, AlignedArray* out, const Shape& shape, const Shape& strides,
             idx_t offset) {
  View v = make_view("compact", shape, strides, offset, a.size);
  check_size("compact", "out", out->size, v.size);
  if (v.size == 0) return;
  MaybeNoGil nogil{double(v.size)};
  if (a.ptr == out->ptr) {  // an in-place compact of an aliasing view goes through a copy
    std::vector<float> tmp(size_t(v.size));
    compact_into(a.ptr, tmp.data(), v);
    std::memcpy(out->ptr, tmp.data(), tmp.size() * sizeof(float));
    return;
  }
  compact_into(a.ptr, out->ptr, v);
}

// question: hw3_setitem
void ewise_setitem(const AlignedArray& a, AlignedArray* out, const Shape& shape,
                   const Shape& strides, idx_t offset) {
  View v = make_view("ewise_setitem", shape, strides, offset, out->size);
  check_size("ewise_setitem", "the source", a.size, v.size);
  if (v.size == 0) return;
  MaybeNoGil nogil{double(v.size)};
  if (a.ptr == out->ptr) {  // source and destination share memory: copy the source first
    std::vector<float> tmp(a.ptr, a.ptr + a.size);
    setitem_from(tmp.data(), out->ptr, v);
    return;
  }
  setitem_from(a.ptr, out->ptr, v);
}

// question: hw3_setitem
void scalar_setitem(idx_t size, float val, AlignedArray* out, const Shape& shape,
                    const Shape& strides, idx_t offset) {
  View v = make_view("scalar_setitem", shape, strides, offset, out->size);
  if (v.size != size)
    fail("scalar_setitem", "size " + std::to_string(size) + " does not match shape " +
                               vec_str(shape) + " (" + std::to_string(v.size) + " elements)");
  MaybeNoGil nogil{double(v.size)};
  setitem_scalar(val, out->ptr, v);
}

// ---- element-wise on strided operands -------------------------------------------------------
// question: hw3_ewise_ops
void ewise_binary(int op, const AlignedArray& a, const Shape& a_strides, idx_t a_offset,
                  const AlignedArray& b, const Shape& b_strides, idx_t b_offset, AlignedArray* out,
                  const Shape& shape) {
  const char* fn = "ewise_binary";
  check_op(fn, op, int(needle::ops::BinaryOp::count));
  const idx_t n = check_view(fn, shape, a_strides, a_offset, a.size);
  check_view(fn, shape, b_strides, b_offset, b.size);
  check_size(fn, "out", out->size, n);
  if (n == 0) return;
  const View2 v = simplify2(shape, a_strides, b_strides, n);
  const bool math = op == int(needle::ops::BinaryOp::power);
  MaybeNoGil nogil{double(n)};
  dispatch_binary(op, [&](auto f) {
    binary_strided(f, a.ptr + a_offset, b.ptr + b_offset, out->ptr, v,
                   math ? kParallelMath : kParallelEwise);
  });
}

// Unary maps for x ** val with the exponents numpy evaluates exactly this way.
template <class Body>
bool dispatch_power_fast(float val, Body&& body) {
  if (val == 2.0f) return body([](float x, float) { return x * x; }), true;
  if (val == 1.0f) return body([](float x, float) { return x; }), true;
  if (val == 0.5f) return body([](float x, float) { return std::sqrt(x); }), true;
  if (val == -1.0f) return body([](float x, float) { return 1.0f / x; }), true;
  if (val == 0.0f) return body([](float, float) { return 1.0f; }), true;
  return false;
}

// question: hw3_scalar_ops
void ewise_scalar(int op, const AlignedArray& a, const Shape& a_strides, idx_t a_offset,
                  float val, AlignedArray* out, const Shape& shape, bool reverse) {
  const char* fn = "ewise_scalar";
  check_op(fn, op, int(needle::ops::BinaryOp::count));
  const idx_t n = check_view(fn, shape, a_strides, a_offset, a.size);
  check_size(fn, "out", out->size, n);
  if (n == 0) return;
  // The scalar is an operand with every stride 0.
  const Shape zeros(shape.size(), 0);
  const View2 v = reverse ? simplify2(shape, zeros, a_strides, n)
                          : simplify2(shape, a_strides, zeros, n);
  const float* x = a.ptr + a_offset;
  const float* lhs = reverse ? &val : x;
  const float* rhs = reverse ? x : &val;
  const bool power = op == int(needle::ops::BinaryOp::power);
  MaybeNoGil nogil{double(n)};
  auto run = [&](auto f) {
    binary_strided(f, lhs, rhs, out->ptr, v, power ? kParallelMath : kParallelEwise);
  };
  if (power && !reverse && dispatch_power_fast(val, run)) return;
  dispatch_binary(op, run);
}

// The vectorised math functions over arrays (out may equal a).
using ArrayFn = void (*)(const float*, float*, int64_t);
ArrayFn vector_math(int op) {
  switch (needle::ops::UnaryOp(op)) {
    case needle::ops::UnaryOp::exp: return vmath::exp_array;
    case needle::ops::UnaryOp::log: return vmath::log_array;
    case needle::ops::UnaryOp::tanh: return vmath::tanh_array;
    case needle::ops::UnaryOp::sigmoid: return vmath::sigmoid_array;
    default: return nullptr;
  }
}

// question: hw3_ewise_ops
void ewise_unary(int op, const AlignedArray& a, const Shape& a_strides, idx_t a_offset,
                 AlignedArray* out, const Shape& shape) {
  const char* fn = "ewise_unary";
  check_op(fn, op, int(needle::ops::UnaryOp::count));
  const idx_t n = check_view(fn, shape, a_strides, a_offset, a.size);
  check_size(fn, "out", out->size, n);
  if (n == 0) return;
  const View2 v = simplify2(shape, a_strides, a_strides, n);
  const float* x = a.ptr + a_offset;
  float* o = out->ptr;
  const idx_t ia = v.sa.back();
  MaybeNoGil nogil{double(n)};
  if (ArrayFn vm = vector_math(op)) {
    parallel_ranges(n, kParallelMath, kEwiseGrain, [&](idx_t lo, idx_t hi) {
      for_runs2(v, lo, hi, [&](idx_t pos, idx_t oa, idx_t, idx_t cnt) {
        if (ia == 1) return vm(x + oa, o + pos, cnt);
        for (idx_t j = 0; j < cnt; ++j) o[pos + j] = x[oa + j * ia];  // gather, then in place
        vm(o + pos, o + pos, cnt);
      });
    });
    return;
  }
  dispatch_unary(op, [&](auto f) {
    parallel_ranges(n, kParallelEwise, kEwiseGrain, [&](idx_t lo, idx_t hi) {
      for_runs2(v, lo, hi, [&](idx_t pos, idx_t oa, idx_t, idx_t cnt) {
        float* __restrict__ d = o + pos;
        const float* s = x + oa;
        if (ia == 1) {
          for (idx_t j = 0; j < cnt; ++j) d[j] = f(s[j]);
        } else {
          for (idx_t j = 0; j < cnt; ++j) d[j] = f(s[j * ia]);
        }
      });
    });
  });
}

// ---- element-wise on compact operands (course) ----------------------------------------------
void check_same_size(const char* fn, const AlignedArray& a, const AlignedArray& out) {
  check_size(fn, "a", a.size, out.size);
}
void check_same_size(const char* fn, const AlignedArray& a, const AlignedArray& b,
                     const AlignedArray& out) {
  check_size(fn, "a", a.size, out.size);
  check_size(fn, "b", b.size, out.size);
}

// Plain loops over [b, e) that the compiler vectorises; threads take chunks above
// kParallelEwise elements (kParallelMath for the compute-bound ones). Called with the GIL
// held (the course's entry points keep it for small arrays, as the strided kernels do).
template <class F>
void map1(const AlignedArray& a, AlignedArray* out, F f, idx_t threshold = kParallelEwise) {
  MaybeNoGil nogil{double(out->size)};
  const float* x = a.ptr;
  float* o = out->ptr;
  parallel_ranges(out->size, threshold, kEwiseGrain, [=](idx_t b, idx_t e) {
    for (idx_t i = b; i < e; ++i) o[i] = f(x[i]);
  });
}

template <class F>
void map2(const AlignedArray& a, const AlignedArray& b, AlignedArray* out, F f) {
  MaybeNoGil nogil{double(out->size)};
  const float* x = a.ptr;
  const float* y = b.ptr;
  float* o = out->ptr;
  parallel_ranges(out->size, kParallelEwise, kEwiseGrain, [=](idx_t lo, idx_t hi) {
    for (idx_t i = lo; i < hi; ++i) o[i] = f(x[i], y[i]);
  });
}

// m.def(name, f, doc, keyword arguments refusing None), f running with the GIL held: the course's
// compact entry points, which release it themselves (MaybeNoGil) when their work pays for it.
template <class F, class... Names>
void def_gil(py::module_& m, const char* name, F f, const char* doc, Names... names) {
  m.def(name, f, doc, needle::bind::arg(names)...);
}

// The course's compact entry points (NEEDLE_COURSE_* in ndarray_bindings.h), bound from the
// shared lists in PYBIND11_MODULE: ewise_<op>(a, b, out) and scalar_<op>(a, val, out) with op's
// functor (Op = needle::ops::Binary_<op>) inlined into the loop.
template <class Op>
void bind_course_binary(py::module_& m, const char* name, bool with_ewise) {
  const std::string ewise = std::string("ewise_") + name, scalar = std::string("scalar_") + name;
  if (with_ewise)
    def_gil(
        m, ewise.c_str(),
        [ewise](const AlignedArray& a, const AlignedArray& b, AlignedArray* out) {
          check_same_size(ewise.c_str(), a, b, *out);
          map2(a, b, out, Op{});
        },
        ("out[i] = " + std::string(name) + "(a[i], b[i]) over compact buffers of one size.").c_str(),
        "a", "b", "out");
  def_gil(
      m, scalar.c_str(),
      [scalar](const AlignedArray& a, float val, AlignedArray* out) {
        check_same_size(scalar.c_str(), a, *out);
        map1(a, out, [val](float x) { return Op{}(x, val); });
      },
      ("out[i] = " + std::string(name) + "(a[i], val) over compact buffers of one size.").c_str(),
      "a", "val", "out");
}

// question: hw3_scalar_ops
void scalar_power(const AlignedArray& a, float val, AlignedArray* out) {
  check_same_size("scalar_power", a, *out);
  auto fast = [&](auto f) { map1(a, out, [f](float x) { return f(x, 0.0f); }); };
  if (dispatch_power_fast(val, fast)) return;
  map1(a, out, [val](float x) { return std::pow(x, val); }, kParallelMath);
}

// question: hw3_ewise_ops
void ewise_math(const char* fn, ArrayFn F, const AlignedArray& a, AlignedArray* out) {
  check_same_size(fn, a, *out);
  MaybeNoGil nogil{double(out->size)};
  const float* x = a.ptr;
  float* o = out->ptr;
  parallel_ranges(out->size, kParallelMath, kEwiseGrain,
                  [=](idx_t b, idx_t e) { F(x + b, o + b, e - b); });
}
// ewise_<name>(a, out) for the course's unary ops, with the vectorised array function F.
template <ArrayFn F>
void bind_course_unary(py::module_& m, const char* name) {
  const std::string fn = std::string("ewise_") + name;
  def_gil(
      m, fn.c_str(), [fn](const AlignedArray& a, AlignedArray* out) { ewise_math(fn.c_str(), F, a, out); },
      ("out[i] = " + std::string(name) + "(a[i]) over compact buffers of one size.").c_str(), "a",
      "out");
}

// ---- reductions -----------------------------------------------------------------------------
// NaN-propagating maximum (numpy's np.maximum).
inline double nan_max(double x, double y) { return (x >= y || x != x) ? x : y; }

// out[j] = op over the contiguous run of `len` elements at base + offset of output j, for
// the outputs of the view `outs`. Threads split the outputs when there are many, or each
// run in chunks (partial results joined in order) when there are few.
// Reductions read each element once and one core nearly saturates memory, so they use
// threads only above kParallelReduce elements (measured on a loaded 2-core machine, a second
// thread made a 16 MB max 1.9x slower, never faster).
constexpr idx_t kParallelReduce = idx_t(1) << 23;

void reduce_runs(bool is_max, const float* base, const View& outs, idx_t len, float* out) {
  const IsaKernels* K = g_isa;
  auto part = [K, is_max](const float* x, idx_t n) {
    return is_max ? double(K->max_contig(x, n)) : K->sum_contig(x, n);
  };
  const idx_t nout = outs.size;
  if (nout >= 4 * max_threads() || nout * len < kParallelReduce) {
    parallel_ranges(nout, std::max<idx_t>(1, kParallelReduce / len),
                    std::max<idx_t>(1, kEwiseGrain / len), [&](idx_t b, idx_t e) {
                      for_runs(outs, b, e, [&](idx_t pos, idx_t off, idx_t n, idx_t s) {
                        for (idx_t t = 0; t < n; ++t)
                          out[pos + t] = float(part(base + off + t * s, len));
                      });
                    });
    return;
  }
  const idx_t grain = 4 * kEwiseGrain, chunks = (len + grain - 1) / grain;
  std::vector<double> partial(static_cast<size_t>(chunks));
  for_runs(outs, 0, nout, [&](idx_t pos, idx_t off, idx_t n, idx_t s) {
    for (idx_t t = 0; t < n; ++t) {
      const float* x = base + off + t * s;
      parallel_ranges(len, kParallelReduce, grain, [&](idx_t b, idx_t e) {
        for (idx_t c = b / grain; c * grain < e; ++c)
          partial[size_t(c)] = part(x + c * grain, std::min(e, (c + 1) * grain) - c * grain);
      });
      double r = partial[0];
      for (idx_t c = 1; c < chunks; ++c)
        r = is_max ? nan_max(r, partial[size_t(c)]) : r + partial[size_t(c)];
      out[pos + t] = float(r);
    }
  });
}

// The kept view's innermost dimension is contiguous: rows of it are combined into the output
// element-wise (vectorised) for every position of the reduced view, e.g. the sum over axis 0
// of a row-major matrix adds its rows into out.
void reduce_rows(bool is_max, const float* base, const View& outs, const View& red, float* out) {
  const idx_t C = outs.shape.back();
  const View prefix = outer_view(outs, 1);
  constexpr idx_t chunk = 1024;
  const idx_t nchunk = (C + chunk - 1) / chunk;
  // Sums accumulate in double (a float running sum over many rows drifts).
  auto item = [&](idx_t q_off, float* o, idx_t c0, idx_t w) {
    double acc[chunk];
    bool first = true;
    float* __restrict__ d = o + c0;
    for_runs(red, 0, red.size, [&](idx_t, idx_t off, idx_t n, idx_t s) {
      for (idx_t t = 0; t < n; ++t) {
        const float* __restrict__ x = base + q_off + off + t * s + c0;
        if (is_max) {
          if (first)
            std::memcpy(d, x, size_t(w) * sizeof(float));
          else
            for (idx_t j = 0; j < w; ++j) d[j] = needle::ops::Reduce_max{}(d[j], x[j]);
        } else {
          if (first)
            for (idx_t j = 0; j < w; ++j) acc[j] = x[j];
          else
            for (idx_t j = 0; j < w; ++j) acc[j] += x[j];
        }
        first = false;
      }
    });
    if (!is_max)
      for (idx_t j = 0; j < w; ++j) d[j] = float(acc[j]);
  };
  const idx_t items = prefix.size * nchunk;
  parallel_ranges(items, std::max<idx_t>(1, kParallelReduce / (chunk * red.size)), 1,
                  [&](idx_t b, idx_t e) {
                    for (idx_t i = b; i < e; ++i) {
                      const idx_t q = i / nchunk, c = i % nchunk, c0 = c * chunk;
                      // offset of prefix position q
                      idx_t rem = q, q_off = prefix.offset;
                      for (int d = int(prefix.shape.size()) - 1; d >= 0; --d) {
                        q_off += (rem % prefix.shape[d]) * prefix.strides[d];
                        rem /= prefix.shape[d];
                      }
                      item(q_off, out + q * C, c0, std::min(chunk, C - c0));
                    }
                  });
}

// Any other layout: each output walks the runs of its reduced view.
void reduce_general(bool is_max, const float* base, const View& outs, const View& red,
                    float* out) {
  const IsaKernels* K = g_isa;
  auto one = [&](const float* x) {
    double acc = is_max ? double(x[red.offset]) : 0.0;
    for_runs(red, 0, red.size, [&](idx_t, idx_t off, idx_t n, idx_t s) {
      const float* r = x + off;
      if (s == 1) {
        acc = is_max ? nan_max(acc, K->max_contig(r, n)) : acc + K->sum_contig(r, n);
      } else if (is_max) {
        for (idx_t t = 0; t < n; ++t) acc = nan_max(acc, r[t * s]);
      } else {
        for (idx_t t = 0; t < n; ++t) acc += r[t * s];
      }
    });
    return float(acc);
  };
  parallel_ranges(outs.size, std::max<idx_t>(1, kParallelReduce / red.size), 1,
                  [&](idx_t b, idx_t e) {
                    for_runs(outs, b, e, [&](idx_t pos, idx_t off, idx_t n, idx_t s) {
                      for (idx_t t = 0; t < n; ++t) out[pos + t] = one(base + off + t * s);
                    });
                  });
}

void reduce(int op, const AlignedArray& a, const Shape& shape, const Shape& strides, idx_t offset,
            idx_t keep, AlignedArray* out) {
  const char* fn = "reduce";
  check_op(fn, op, int(needle::ops::ReduceOp::count));
  check_view(fn, shape, strides, offset, a.size);
  if (keep < 0 || keep > idx_t(shape.size()))
    fail(fn, "keep " + std::to_string(keep) + " is outside [0, " + std::to_string(shape.size()) +
                 "] for shape " + vec_str(shape));
  const Shape kshape(shape.begin(), shape.begin() + keep), kstrides(strides.begin(), strides.begin() + keep);
  const Shape rshape(shape.begin() + keep, shape.end()), rstrides(strides.begin() + keep, strides.end());
  const idx_t kept = needle::checks::shape_size(fn, kshape);
  const idx_t reduced = needle::checks::shape_size(fn, rshape);
  check_size(fn, "out", out->size, kept);
  if (kept == 0) return;
  const bool is_max = op == int(needle::ops::ReduceOp::max);
  if (reduced == 0) {
    if (is_max) fail(fn, "max over an empty extent " + vec_str(rshape) + " has no identity");
    std::fill(out->ptr, out->ptr + kept, 0.0f);
    return;
  }
  const View outs = simplified(kshape, kstrides, offset, kept);
  const View red = simplified(rshape, rstrides, 0, reduced);
  MaybeNoGil nogil{double(kept) * double(reduced)};
  if (red.shape.size() == 1 && (red.strides[0] == 1 || red.shape[0] == 1))
    return reduce_runs(is_max, a.ptr, outs, red.shape[0], out->ptr);
  if (red.strides.back() == 1 && red.shape.back() >= 64)
    return reduce_general(is_max, a.ptr, outs, red, out->ptr);
  if (outs.strides.back() == 1 && outs.shape.back() >= 8)
    return reduce_rows(is_max, a.ptr, outs, red, out->ptr);
  reduce_general(is_max, a.ptr, outs, red, out->ptr);
}

void check_reduce(const char* fn, const AlignedArray& a, const AlignedArray& out, idx_t rs) {
  if (rs <= 0) fail(fn, "reduce_size must be positive, got " + std::to_string(rs));
  const __int128 need = __int128(out.size) * rs;
  if (need > a.size)
    fail(fn, "out has " + std::to_string(out.size) + " elements, reducing " + std::to_string(rs) +
                 " each needs " + std::to_string(idx_t(std::min<__int128>(need, INT64_MAX))) +
                 " but a has " + std::to_string(a.size));
}

// Course: out[j] = op of the compact a[j*rs : (j+1)*rs].
void reduce_compact(bool is_max, const char* fn, const AlignedArray& a, AlignedArray* out,
                    idx_t rs) {
  check_reduce(fn, a, *out, rs);
  if (out->size == 0) return;
  MaybeNoGil nogil{double(out->size) * double(rs)};
  const View outs = simplified({out->size}, {rs}, 0, out->size);
  reduce_runs(is_max, a.ptr, outs, rs, out->ptr);
}
// question: hw3_reductions
void reduce_sum(const AlignedArray& a, AlignedArray* out, idx_t reduce_size) {
  reduce_compact(false, "reduce_sum", a, out, reduce_size);
}
// question: hw3_reductions
void reduce_max(const AlignedArray& a, AlignedArray* out, idx_t reduce_size) {
  reduce_compact(true, "reduce_max", a, out, reduce_size);
}

// ---- matrix products ------------------------------------------------------------------------
bool overlaps(const AlignedArray& x, const AlignedArray& y) {
  return x.ptr < y.ptr + std::max<idx_t>(y.size, 1) && y.ptr < x.ptr + std::max<idx_t>(x.size, 1);
}

// Runs body(c) on out's memory, or on a scratch buffer copied to out afterwards when out
// shares memory with an input.
template <class F>
void with_output(const AlignedArray& a, const AlignedArray& b, AlignedArray* out, idx_t count,
                 F body) {
  if (!overlaps(*out, a) && !overlaps(*out, b)) return body(out->ptr);
  AlignedArray tmp(count);
  body(tmp.ptr);
  std::memcpy(out->ptr, tmp.ptr, size_t(count) * sizeof(float));
}

// out (compact, batch + (m, p)) = A[k] @ B[k] over the batch dimensions `batch` (see
// common/ndarray_attention.h): each operand has one stride per batch dimension, then row and
// column.
void matmul_strided(const AlignedArray& a, const Shape& a_strides, idx_t a_offset,
                    const AlignedArray& b, const Shape& b_strides, idx_t b_offset,
                    AlignedArray* out, const Shape& batch, idx_t m, idx_t n, idx_t p) {
  const char* fn = "matmul_strided";
  check_sizes(fn, {m, n, p});
  needle::batch::check(fn, batch, a_strides, b_strides);
  Shape a_shape = batch, b_shape = batch, out_shape = batch;
  a_shape.insert(a_shape.end(), {m, n});
  b_shape.insert(b_shape.end(), {n, p});
  out_shape.insert(out_shape.end(), {m, p});
  check_view(fn, a_shape, a_strides, a_offset, a.size);
  check_view(fn, b_shape, b_strides, b_offset, b.size);
  const idx_t size = needle::checks::shape_size(fn, out_shape);
  check_size(fn, "out", out->size, size);
  if (size == 0) return;
  const idx_t count = size / (m * p);
  MaybeNoGil nogil{double(count) * double(m) * double(n) * double(p)};
  const size_t nb = batch.size();
  const auto dims = needle::batch::collapse(batch, Shape(a_strides.begin(), a_strides.end() - 2),
                                            Shape(b_strides.begin(), b_strides.end() - 2));
  with_output(a, b, out, size, [&](float* c) {
    if (n == 0) return std::fill(c, c + size, 0.0f);
    needle::batch::for_each_group(dims, [&](const needle::batch::Group& g) {
      g_isa->gemm(MatView{a.ptr + a_offset + g.a, g.outer.a, a_strides[nb], a_strides[nb + 1],
                          g.inner.size, g.inner.a},
                  MatView{b.ptr + b_offset + g.b, g.outer.b, b_strides[nb], b_strides[nb + 1],
                          g.inner.size, g.inner.b},
                  c + g.first * m * p, g.outer.size * g.inner.size, m, n, p, runner());
    });
  });
}

void check_matmul(const char* fn, const AlignedArray& a, const AlignedArray& b,
                  const AlignedArray& out, idx_t m, idx_t n, idx_t p) {
  check_sizes(fn, {m, n, p});
  check_at_least(fn, "a", a.size, needle::checks::shape_size(fn, {m, n}));
  check_at_least(fn, "b", b.size, needle::checks::shape_size(fn, {n, p}));
  check_at_least(fn, "out", out.size, needle::checks::shape_size(fn, {m, p}));
}

// Course: row-major operands, the same engine as matmul_strided.
// question: hw3_matmul
void matmul(const AlignedArray& a, const AlignedArray& b, AlignedArray* out, idx_t m, idx_t n,
            idx_t p) {
  check_matmul("matmul", a, b, *out, m, n, p);
  if (m == 0 || p == 0) return;
  MaybeNoGil nogil{double(m) * double(n) * double(p)};
  with_output(a, b, out, m * p, [&](float* c) {
    if (n == 0) return std::fill(c, c + m * p, 0.0f);
    g_isa->gemm(MatView{a.ptr, 0, n, 1}, MatView{b.ptr, 0, p, 1}, c, 1, m, n, p, runner());
  });
}

// The homework's tiled algorithm, a lecture exhibit (not the engine): operands and result in
// the (rows/T, cols/T, T, T) layout; each T x T output tile accumulates the T x T x T products
// of a row of A tiles and a column of B tiles in a local tile, then is stored.
// question: hw3_matmul
void matmul_tiled(const AlignedArray& a, const AlignedArray& b, AlignedArray* out, idx_t m,
                  idx_t n, idx_t p) {
  constexpr idx_t T = kTile;
  check_matmul("matmul_tiled", a, b, *out, m, n, p);
  if (m % T || n % T || p % T)
    fail("matmul_tiled", "m=" + std::to_string(m) + ", n=" + std::to_string(n) + ", p=" +
                             std::to_string(p) + " must be multiples of the tile size " +
                             std::to_string(T));
  MaybeNoGil nogil{double(m) * double(n) * double(p)};
  with_output(a, b, out, m * p, [&](float* c) {
    const idx_t tn = n / T, tp = p / T;
    for (idx_t i = 0; i < m / T; ++i)
      for (idx_t j = 0; j < tp; ++j) {
        float acc[T][T] = {};
        for (idx_t k = 0; k < tn; ++k) {
          const float* at = a.ptr + (i * tn + k) * T * T;
          const float* bt = b.ptr + (k * tp + j) * T * T;
          for (idx_t r = 0; r < T; ++r)
            for (idx_t q = 0; q < T; ++q)
              for (idx_t s = 0; s < T; ++s) acc[r][s] += at[r * T + q] * bt[q * T + s];
        }
        std::memcpy(c + (i * tp + j) * T * T, acc, sizeof acc);
      }
  });
}

// The textbook (i, j, k) triple loop on row-major operands, for comparison.
// question: hw3_matmul
void matmul_naive(const AlignedArray& a, const AlignedArray& b, AlignedArray* out, idx_t m,
                  idx_t n, idx_t p) {
  check_matmul("matmul_naive", a, b, *out, m, n, p);
  MaybeNoGil nogil{double(m) * double(n) * double(p)};
  with_output(a, b, out, m * p, [&](float* c) {
    for (idx_t i = 0; i < m; ++i)
      for (idx_t j = 0; j < p; ++j) {
        float s = 0.0f;
        for (idx_t k = 0; k < n; ++k) s += a.ptr[i * n + k] * b.ptr[k * p + j];
        c[i * p + j] = s;
      }
  });
}

// ---- module state ---------------------------------------------------------------------------
py::dict cache_info() {
  const auto s = BufferCache::instance().stats();
  py::dict d;
  d["bytes"] = s.bytes;
  d["buffers"] = s.buffers;
  d["cap_bytes"] = kCacheMaxBytes;
  d["min_bytes"] = kCacheMinBytes;
  d["max_buffer_bytes"] = kCacheMaxBytes / 4;
  return d;
}

py::dict memory_stats() {
  py::dict d;
  d["live_bytes"] = live_bytes().load();
  d["peak_bytes"] = peak_bytes().load();
  return d;
}

py::dict gemm_info() {
  const GemmConfig& c = g_isa->config;
  py::dict d;
  d["isa"] = c.isa;
  d["VW"] = c.VW;
  d["MR"] = c.MR;
  d["NR"] = c.NR;
  d["KC"] = c.KC;
  d["MC"] = c.MC;
  d["tile"] = kTile;
  d["direct_flops"] = kGemmDirectFlops;
  d["parallel_flops"] = kGemmParallelFlops;
  d["split_flops"] = kGemmSplitFlops;
  d["own_pack_floats"] = kGemmOwnPackFloats;
  py::list avail;
  for (const IsaKernels* k : available_isas()) avail.append(k->config.isa);
  d["available"] = py::tuple(avail);
  return d;
}

int num_threads() { return max_threads(); }

template <size_t N>
py::tuple names(const char* const (&list)[N]) {
  py::tuple t(N);
  for (size_t i = 0; i < N; ++i) t[i] = py::str(list[i]);
  return t;
}

}  // namespace needle::cpu

PYBIND11_MODULE(ndarray_backend_cpu, m) {
  namespace py = pybind11;
  using namespace needle::cpu;
  m.doc() = R"doc(needle's compiled CPU device: the device protocol of needle.backend_ndarray.protocol.

Buffers are flat, 64-byte aligned float32 ``Array`` objects; shapes, strides (in elements, may be
0 or negative) and offsets describe strided views of them. Every function checks its arguments
first: ValueError (naming the sizes) for a view that leaves its buffer, sizes that disagree, a
negative size or an unknown op code; TypeError for a wrong kind of argument.

Element-wise ops (ewise_binary, ewise_scalar, ewise_unary) and reductions (reduce) read strided
operands directly, broadcast and permuted ones included, and write a compact output. Op codes are
positions in __binary_ops__, __unary_ops__ and __reduce_ops__.

Matrix products, C (m, p) = A (m, n) @ B (n, p):
  matmul_strided  batched, strided operands (a transposed operand is a swapped pair of strides, a
                  shared one a batch stride of 0), packed straight from the views into a blocked
                  engine with a register-blocked micro-kernel; small products take a direct loop.
  matmul          the course's row-major form, the same engine.
  matmul_tiled    the homework's tile-by-tile algorithm over the (rows/T, cols/T, T, T) layout,
                  T = __tile_size__ (a lecture exhibit, not the engine).
  matmul_naive    the textbook (i, j, k) triple loop.
__gemm__ names the engine's instruction set (avx512, avx2 or portable: the best the CPU has, or
NEEDLE_CPU_ISA) and its blocking constants. conv_fwd, conv_input_grad and conv_weight_grad are
one call each: im2col / col2im here, one product on the same engine. exp, log, tanh and sigmoid use vectorised Cephes
polynomials (within 2 ulp).

Large kernels share their work with a pool of helper threads: OMP_NUM_THREADS threads in all,
else one per CPU (num_threads()). The calling thread always works too and never waits for a
helper that has not started. In a child created by fork() everything runs on the calling thread.
)doc";
  install_fork_handler();
  choose_isa();
  m.attr("__device_name__") = "cpu";
  m.attr("__tile_size__") = kTile;
  m.attr("__matmul_kernel__") = g_isa->config.isa;
  m.attr("__gemm__") = gemm_info();
  m.attr("__binary_ops__") = names(needle::ops::kBinaryOpNames);
  m.attr("__unary_ops__") = names(needle::ops::kUnaryOpNames);
  m.attr("__reduce_ops__") = names(needle::ops::kReduceOpNames);

  add_array_type(m);

  // No argument may be None (a None Array would reach the kernels as a null pointer).
  auto arg = [](const char* name) { return py::arg(name).none(false); };
  m.def("to_numpy", &to_numpy, "A numpy copy of the strided view (shape, strides, offset) of a.",
        arg("a"), arg("shape"), arg("strides"), arg("offset"));
  m.def("from_numpy", &from_numpy, "Copy a numpy array (row-major) into out.", arg("a"),
        arg("out"));
  m.def("fill", &fill, "Set every element of out to val.", arg("out"), arg("val"));
  m.def("compact", &compact, "out (row-major) = the strided view of a.", arg("a"), arg("out"),
        arg("shape"), arg("strides"), arg("offset"));
  m.def("ewise_setitem", &ewise_setitem, "The strided view of out = compact a.", arg("a"),
        arg("out"), arg("shape"), arg("strides"), arg("offset"));
  m.def("scalar_setitem", &scalar_setitem, "The strided view of out (size elements) = val.",
        arg("size"), arg("val"), arg("out"), arg("shape"), arg("strides"), arg("offset"));

  m.def("ewise_binary", &ewise_binary,
        "out (compact) = __binary_ops__[op](view of a, view of b), both views of shape.",
        arg("op"), arg("a"), arg("a_strides"), arg("a_offset"), arg("b"), arg("b_strides"),
        arg("b_offset"), arg("out"), arg("shape"));
  m.def("ewise_scalar", &ewise_scalar,
        "out = __binary_ops__[op](view of a, val), or op(val, view of a) when reverse.",
        arg("op"), arg("a"), arg("a_strides"), arg("a_offset"), arg("val"), arg("out"),
        arg("shape"), arg("reverse"));
  m.def("ewise_unary", &ewise_unary, "out = __unary_ops__[op](view of a).", arg("op"), arg("a"),
        arg("a_strides"), arg("a_offset"), arg("out"), arg("shape"));
  m.def("reduce", &reduce,
        "out (prod(shape[:keep])) = __reduce_ops__[op] over the axes shape[keep:] of the view.",
        arg("op"), arg("a"), arg("shape"), arg("strides"), arg("offset"), arg("keep"), arg("out"));

  // The course's compact entry points, from the list both modules share (ndarray_bindings.h).
#define NEEDLE_BIND_BINARY(name) bind_course_binary<needle::ops::Binary_##name>(m, #name, true);
#define NEEDLE_BIND_SCALAR(name)                                                                 \
  def_gil(m, "scalar_" #name, &scalar_##name,                                                    \
          "out[i] = " #name "(a[i], val) over compact buffers of one size.", "a", "val", "out");
#define NEEDLE_BIND_UNARY(name) bind_course_unary<vmath::name##_array>(m, #name);
  NEEDLE_COURSE_BINARY(NEEDLE_BIND_BINARY)
  NEEDLE_COURSE_SCALAR(NEEDLE_BIND_SCALAR)
  NEEDLE_COURSE_UNARY(NEEDLE_BIND_UNARY)
#undef NEEDLE_BIND_BINARY
#undef NEEDLE_BIND_SCALAR
#undef NEEDLE_BIND_UNARY
  m.def("reduce_max", &reduce_max, "out[j] = max of a[j*reduce_size:(j+1)*reduce_size].",
        arg("a"), arg("out"), arg("reduce_size"));
  m.def("reduce_sum", &reduce_sum, "out[j] = sum of a[j*reduce_size:(j+1)*reduce_size].",
        arg("a"), arg("out"), arg("reduce_size"));

  constexpr const char* matmul_doc =
      "out (compact, batch + (m, p)) = A[k] @ B[k] over strided views; batch is an int or a tuple "
      "of batch dimensions, and each operand has one stride per batch dimension, then row and "
      "column.";
  m.def("matmul_strided", &matmul_strided, matmul_doc, arg("a"), arg("a_strides"),
        arg("a_offset"), arg("b"), arg("b_strides"), arg("b_offset"), arg("out"), arg("batch"),
        arg("m"), arg("n"), arg("p"));
  m.def(
      "matmul_strided",
      [](const AlignedArray& a, const Shape& a_strides, idx_t a_offset, const AlignedArray& b,
         const Shape& b_strides, idx_t b_offset, AlignedArray* out, idx_t batch, idx_t m,
         idx_t n, idx_t p) {
        matmul_strided(a, a_strides, a_offset, b, b_strides, b_offset, out, Shape{batch}, m, n, p);
      },
      matmul_doc, arg("a"), arg("a_strides"), arg("a_offset"), arg("b"), arg("b_strides"),
      arg("b_offset"), arg("out"), arg("batch"), arg("m"), arg("n"), arg("p"));
  m.def("matmul", &matmul, "out (m, p) = a (m, n) @ b (n, p), row-major.", arg("a"), arg("b"),
        arg("out"), arg("m"), arg("n"), arg("p"));
  m.def("matmul_tiled", &matmul_tiled,
        "out = a @ b in the (rows/T, cols/T, T, T) tiled layout, tile by tile (an exhibit).",
        arg("a"), arg("b"), arg("out"), arg("m"), arg("n"), arg("p"));
  m.def("matmul_naive", &matmul_naive, "out = a @ b by the plain triple loop (row-major).",
        arg("a"), arg("b"), arg("out"), arg("m"), arg("n"), arg("p"));

  // The fused kernels, from the list both modules share (ndarray_bindings.h).
#define NEEDLE_BIND_FUSED(name, doc, ...) needle::bind::def_nogil(m, #name, &fused::name, doc, __VA_ARGS__);
  NEEDLE_FUSED_KERNELS(NEEDLE_BIND_FUSED)
#undef NEEDLE_BIND_FUSED
#define NEEDLE_BIND_CONV(name, doc, ...) needle::bind::def_nogil(m, #name, &conv::name, doc, __VA_ARGS__);
  NEEDLE_CONV_KERNELS(NEEDLE_BIND_CONV)
#undef NEEDLE_BIND_CONV

  m.def("num_threads", &num_threads,
        "Threads the large kernels use: OMP_NUM_THREADS, else one per core (an extension).");
  m.def("cache_info", &cache_info,
        "The buffer cache: {'bytes', 'buffers'} kept now, 'cap_bytes' in all, and the sizes of "
        "buffer it keeps ('min_bytes' .. 'max_buffer_bytes').");
  m.def("cache_clear", [] { BufferCache::instance().clear(); }, "Free every cached buffer.");
  m.def("memory_stats", &memory_stats,
        "{'live_bytes', 'peak_bytes'}: bytes held by live Arrays now and at most since "
        "reset_peak().");
  m.def("reset_peak", [] { peak_bytes().store(live_bytes().load()); },
        "Restart the peak of memory_stats() from the live bytes.");
}
