// Strided element-wise kernels of the CPU module (ewise_binary, ewise_scalar, ewise_unary; the
// reductions are in ndarray_backend_cpu.cc): operands are read through their views, broadcast
// (stride 0) and permuted ones included, with no compact copy.
//
// A view is first simplified: size-1 dimensions dropped, neighbours merged where every operand
// allows it (a compact operand, or a row broadcast against a compact one, becomes one flat
// run). The kernels then walk runs along the innermost dimension; each run takes one of four
// loops chosen by its inner strides: both 1 (vectorised), one of them 0 (a broadcast scalar
// against a contiguous run, vectorised) or general. The output is compact, so its runs are
// always contiguous.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ndarray_backend_cpu_strided.h"
#include "ndarray_ops.h"

namespace needle::cpu {

// Element counts above which loops use every thread: memory-bound loops, and compute-bound
// ones (exp, log, tanh, sigmoid, pow). Threads claim kEwiseGrain elements at a time.
constexpr idx_t kParallelEwise = idx_t(1) << 18;
constexpr idx_t kParallelMath = idx_t(1) << 16;
constexpr idx_t kEwiseGrain = idx_t(1) << 15;

// A common shape with the strides of two inputs, simplified (see the file comment).
struct View2 {
  std::vector<idx_t> shape, sa, sb;
  idx_t size = 1;
};

inline View2 simplify2(const std::vector<idx_t>& shape, const std::vector<idx_t>& sa,
                       const std::vector<idx_t>& sb, idx_t size) {
  View2 v;
  v.size = size;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!v.shape.empty() && v.sa.back() == sa[d] * shape[d] && v.sb.back() == sb[d] * shape[d]) {
      v.shape.back() *= shape[d];
      v.sa.back() = sa[d];
      v.sb.back() = sb[d];
    } else {
      v.shape.push_back(shape[d]);
      v.sa.push_back(sa[d]);
      v.sb.push_back(sb[d]);
    }
  }
  if (v.shape.empty()) {
    v.shape.push_back(1);
    v.sa.push_back(0);
    v.sb.push_back(0);
  }
  return v;
}

// Calls f(pos, off_a, off_b, count) for each inner run whose row-major positions lie in
// [begin, end); the runs' inner strides are v.sa.back() and v.sb.back().
template <class F>
inline void for_runs2(const View2& v, idx_t begin, idx_t end, F&& f) {
  const int nd = int(v.shape.size());
  idx_t idx[64];
  idx_t rem = begin, oa = 0, ob = 0;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % v.shape[d];
    rem /= v.shape[d];
    oa += idx[d] * v.sa[d];
    ob += idx[d] * v.sb[d];
  }
  const idx_t n_in = v.shape[nd - 1], ia = v.sa[nd - 1], ib = v.sb[nd - 1];
  idx_t pos = begin;
  while (pos < end) {
    const idx_t count = std::min(n_in - idx[nd - 1], end - pos);
    f(pos, oa, ob, count);
    pos += count;
    oa += count * ia;
    ob += count * ib;
    idx[nd - 1] += count;
    for (int d = nd - 1; d > 0 && idx[d] == v.shape[d]; --d) {
      oa -= idx[d] * v.sa[d];
      ob -= idx[d] * v.sb[d];
      idx[d] = 0;
      ++idx[d - 1];
      oa += v.sa[d - 1];
      ob += v.sb[d - 1];
    }
  }
}

// o[0:n] = f(a[j*sa], b[j*sb]), with vectorisable loops for the common stride pairs.
template <class F>
inline void binary_run(F f, const float* a, idx_t sa, const float* b, idx_t sb,
                       float* __restrict__ o, idx_t n) {
  if (sa == 1 && sb == 1) {
    for (idx_t j = 0; j < n; ++j) o[j] = f(a[j], b[j]);
  } else if (sa == 1 && sb == 0) {
    const float y = *b;
    for (idx_t j = 0; j < n; ++j) o[j] = f(a[j], y);
  } else if (sa == 0 && sb == 1) {
    const float x = *a;
    for (idx_t j = 0; j < n; ++j) o[j] = f(x, b[j]);
  } else {
    for (idx_t j = 0; j < n; ++j) o[j] = f(a[j * sa], b[j * sb]);
  }
}

// out (compact) = f(view a, view b) over the simplified view v (a, b at their offsets).
template <class F>
inline void binary_strided(F f, const float* a, const float* b, float* out, const View2& v,
                           idx_t threshold) {
  const idx_t ia = v.sa.back(), ib = v.sb.back();
  parallel_ranges(v.size, threshold, kEwiseGrain, [&](idx_t lo, idx_t hi) {
    for_runs2(v, lo, hi, [&](idx_t pos, idx_t oa, idx_t ob, idx_t n) {
      binary_run(f, a + oa, ia, b + ob, ib, out + pos, n);
    });
  });
}

// Calls body(functor) for binary op code `op` (checked by the caller).
template <class Body>
inline void dispatch_binary(int op, Body&& body) {
  switch (needle::ops::BinaryOp(op)) {
#define NEEDLE_CASE(name, ...) \
  case needle::ops::BinaryOp::name: return body(needle::ops::Binary_##name{});
    NEEDLE_BINARY_OPS(NEEDLE_CASE)
#undef NEEDLE_CASE
    default: return;
  }
}

template <class Body>
inline void dispatch_unary(int op, Body&& body) {
  switch (needle::ops::UnaryOp(op)) {
#define NEEDLE_CASE(name, ...) \
  case needle::ops::UnaryOp::name: return body(needle::ops::Unary_##name{});
    NEEDLE_UNARY_OPS(NEEDLE_CASE)
#undef NEEDLE_CASE
    default: return;
  }
}

}  // namespace needle::cpu
