// Strided element-wise kernels of the CPU module (ewise_binary, ewise_scalar, ewise_unary; the
// reductions are in ndarray_backend_cpu.cc): operands are read through their views, broadcast
// (stride 0) and permuted ones included, with no compact copy.
//
// A view is first simplified: size-1 dimensions dropped, neighbours merged where every operand
// allows it (a compact operand, or a row broadcast against a compact one, becomes one flat
// run). The kernels then walk runs along the innermost dimension; each run takes one of four
// loops chosen by its inner strides: both 1 (vectorised), one of them 0 (a broadcast scalar
// against a contiguous run, vectorised) or general. The output is compact, so its runs are
// always contiguous. A large transposed operand is first copied in blocks into a scratch
// buffer (with_compact_operands).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "cpu/ndarray_backend_cpu_alloc.h"
#include "cpu/ndarray_backend_cpu_strided.h"
#include "common/ndarray_ops.h"

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

// Compact-first plan. When an operand's inner stride is far from 1 (a transposed view) and
// the walk reads one element per cache line, strided reads cost more than a copy: adding a
// transposed 2048x2048 view in place took 4x as long as copying it in blocks
// (compact_blocked_2d) and adding compact arrays. Views of at least kScratchMin elements whose
// such operand is a 2-D view (after simplification: a transposed matrix, or a transposed
// batch that merges) are therefore copied in blocks into a scratch buffer first; smaller ones
// fit in cache and keep the plain walk and its per-call cost.
constexpr idx_t kScratchMin = idx_t(1) << 18;

inline idx_t abs_stride(idx_t s) { return s < 0 ? -s : s; }

// The strided view of one operand of v (strides s) when it should be compacted first.
inline bool compact_first(const View2& v, const std::vector<idx_t>& s, View* view) {
  const size_t nd = v.shape.size();
  if (nd < 2 || v.size < kScratchMin) return false;
  if (abs_stride(s[nd - 1]) <= 1 || abs_stride(s[nd - 2]) >= abs_stride(s[nd - 1])) return false;
  *view = simplified(v.shape, s, 0, v.size);
  return blocked_2d_applies(*view);
}

// Runs body(a, b, v) with cache-hostile operands of v replaced by compact scratch copies.
template <class Body>
inline void with_compact_operands(const float* a, const float* b, const View2& v, Body&& body) {
  View va, vb;
  const bool ca = compact_first(v, v.sa, &va), cb = compact_first(v, v.sb, &vb);
  if (!ca && !cb) return body(a, b, v);
  std::vector<idx_t> compact(v.shape.size());
  idx_t stride = 1;
  for (size_t d = compact.size(); d-- > 0;) compact[d] = stride, stride *= v.shape[d];
  std::optional<AlignedArray> sa, sb;  // counted by the allocator like any other buffer
  if (ca) {
    compact_into(a, sa.emplace(v.size).ptr, va);
    a = sa->ptr;
  }
  if (cb) {
    compact_into(b, sb.emplace(v.size).ptr, vb);
    b = sb->ptr;
  }
  body(a, b, simplify2(v.shape, ca ? compact : v.sa, cb ? compact : v.sb, v.size));
}

// out (compact) = f(view a, view b) over the simplified view v (a, b at their offsets).
template <class F>
inline void binary_strided(F f, const float* a, const float* b, float* out, const View2& v,
                           idx_t threshold) {
  with_compact_operands(a, b, v, [&](const float* a, const float* b, const View2& v) {
    const idx_t ia = v.sa.back(), ib = v.sb.back();
    parallel_ranges(v.size, threshold, kEwiseGrain, [&](idx_t lo, idx_t hi) {
      for_runs2(v, lo, hi, [&](idx_t pos, idx_t oa, idx_t ob, idx_t n) {
        binary_run(f, a + oa, ia, b + ob, ib, out + pos, n);
      });
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
