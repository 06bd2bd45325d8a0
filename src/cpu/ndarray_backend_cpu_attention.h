// The CPU module's attention kernels: softmax over the rows of a (rows, cols) matrix, scaled and
// optionally causally masked, and its backward (protocol.py: softmax_fwd, softmax_bwd). Masked
// keys get probability exactly 0 and are never read, so attention needs no mask array and no
// separate scaling pass. The argument checks are in common/ndarray_attention.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/ndarray_attention.h"
#include "cpu/ndarray_backend_cpu_alloc.h"
#include "cpu/ndarray_backend_cpu_fused.h"
#include "cpu/ndarray_backend_cpu_math.h"

namespace needle::cpu {
namespace fused {

using needle::checks::check_softmax_bwd;
using needle::checks::check_softmax_fwd;
using needle::checks::softmax_visible;

void softmax_fwd(const AlignedArray& x, idx_t rows, idx_t cols, double scale, idx_t queries,
                 AlignedArray* y) {
  check_softmax_fwd("softmax_fwd", x, rows, cols, queries, *y);
  const float s = float(scale);
  for_rows(rows, cols, [&](idx_t r) {
    const float* xr = x.ptr + r * cols;
    float* e = y->ptr + r * cols;
    const idx_t n = softmax_visible(r, cols, queries);
    if (n == 0) {  // every key masked: uniform, as the course's finite mask gives
      for (idx_t j = 0; j < cols; ++j) e[j] = 1.0f / float(cols);
      return;
    }
    for (idx_t j = 0; j < n; ++j) e[j] = s * xr[j];
    float mx = max_float(e, n);
    if (!std::isfinite(mx)) mx = 0.0f;  // an all -inf row stays NaN below, as in numpy
    for (idx_t j = 0; j < n; ++j) e[j] -= mx;
    vmath::exp_array(e, e, n);
    const float inv = 1.0f / float(sum_double(n, [e](idx_t j) { return double(e[j]); }));
    for (idx_t j = 0; j < n; ++j) e[j] *= inv;
    for (idx_t j = n; j < cols; ++j) e[j] = 0.0f;
  });
}

void softmax_bwd(const AlignedArray& y, const AlignedArray& dy, idx_t rows, idx_t cols,
                 double scale, AlignedArray* dx) {
  check_softmax_bwd("softmax_bwd", y, dy, rows, cols, *dx);
  const float s = float(scale);
  for_rows(rows, cols, [&](idx_t r) {
    const float* yr = y.ptr + r * cols;
    const float* gr = dy.ptr + r * cols;
    float* out = dx->ptr + r * cols;
    const float dot =
        float(sum_double(cols, [yr, gr](idx_t j) { return double(yr[j]) * double(gr[j]); }));
    for (idx_t j = 0; j < cols; ++j) out[j] = s * (yr[j] * (gr[j] - dot));
  });
}

}  // namespace fused
}  // namespace needle::cpu
