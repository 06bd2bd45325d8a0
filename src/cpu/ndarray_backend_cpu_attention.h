// The CPU module's attention kernels: softmax over the rows of a (rows, cols) matrix, scaled and
// optionally causally masked, and its backward (protocol.py: softmax_fwd, softmax_bwd). Masked
// keys get probability exactly 0 and are never read, so attention needs no mask array and no
// separate scaling pass. attention_fwd / attention_bwd run a whole attention,
// softmax(scale · q kᵀ) v, per head: the head's logits, weights and their adjoints stay in a row
// buffer and the L1 cache (T = D = 32: 4 KiB a matrix) instead of passing through memory between
// a batched product, a softmax and another product. The argument checks are in
// common/ndarray_attention.h.
#pragma once

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/ndarray_attention.h"
#include "cpu/ndarray_backend_cpu_alloc.h"
#include "cpu/ndarray_backend_cpu_fused.h"
#include "cpu/ndarray_backend_cpu_math.h"

namespace needle::cpu {
namespace fused {

using needle::checks::check_attention_bwd;
using needle::checks::check_attention_fwd;
using needle::checks::check_softmax_bwd;
using needle::checks::check_softmax_fwd;
using needle::checks::softmax_visible;

// y[0:cols] = softmax of s * x[0:n], zeros past n (the masked keys); a row that sees no key
// (n == 0) is uniform, as the course's finite mask makes it. y may be x.
inline void softmax_row(const float* x, float* y, idx_t cols, idx_t n, float s) {
  if (n == 0) {
    for (idx_t j = 0; j < cols; ++j) y[j] = 1.0f / float(cols);
    return;
  }
  for (idx_t j = 0; j < n; ++j) y[j] = s * x[j];
  float mx = max_float(y, n);
  if (!std::isfinite(mx)) mx = 0.0f;  // an all -inf row stays NaN below, as in numpy
  for (idx_t j = 0; j < n; ++j) y[j] -= mx;
  vmath::exp_array(y, y, n);
  const float inv = 1.0f / float(sum_double(n, [y](idx_t j) { return double(y[j]); }));
  for (idx_t j = 0; j < n; ++j) y[j] *= inv;
  for (idx_t j = n; j < cols; ++j) y[j] = 0.0f;
}

// The masked softmax of W = vmath::W rows at once, one per lane, from their logits stored
// transposed: zt[j * stride + l] is row l's logit of key j; row l sees keys j < visible[l] (at
// least one). Lane-wise maxima, exps and sums (no reduction across lanes, whose serial
// dependence made one row at a time cost ~90 ns for 32 keys); the weights replace the logits.
inline void softmax_lanes(float* zt, idx_t stride, idx_t keys, const vmath::vi& visible,
                          float s) {
  using vmath::vf;
  using vmath::vi;
  vf mx = vmath::splat(-INFINITY);
  for (idx_t j = 0; j < keys; ++j) {
    vf z;
    std::memcpy(&z, zt + j * stride, sizeof z);
    z = vmath::select(vi{} + int32_t(j) < visible, z * s, vmath::splat(-INFINITY));
    std::memcpy(zt + j * stride, &z, sizeof z);
    mx = z > mx ? z : mx;  // NaNs ignored, as max_float does
  }
  mx = vmath::select(mx - mx == 0.0f, mx, vf{});  // a non-finite maximum: 0 (NaN rows stay NaN)
  vf total{};
  for (idx_t j = 0; j < keys; ++j) {
    vf e;
    std::memcpy(&e, zt + j * stride, sizeof e);
    e = vmath::exp(e - mx);
    std::memcpy(zt + j * stride, &e, sizeof e);
    total += e;
  }
  const vf inv = 1.0f / total;
  for (idx_t j = 0; j < keys; ++j) {
    vf e;
    std::memcpy(&e, zt + j * stride, sizeof e);
    e *= inv;
    std::memcpy(zt + j * stride, &e, sizeof e);
  }
}

void softmax_fwd(const AlignedArray& x, idx_t rows, idx_t cols, double scale, idx_t queries,
                 AlignedArray* y) {
  check_softmax_fwd("softmax_fwd", x, rows, cols, queries, *y);
  const float s = float(scale);
  for_rows(rows, cols, [&](idx_t r) {
    softmax_row(x.ptr + r * cols, y->ptr + r * cols, cols, softmax_visible(r, cols, queries), s);
  });
}

// dx[0:cols] = s * y * (dy - Σ dy·y) (dx may be dy).
inline void softmax_row_bwd(const float* y, const float* dy, float* dx, idx_t cols, float s) {
  const float dot = float(sum_double(cols, [y, dy](idx_t j) { return double(y[j]) * double(dy[j]); }));
  for (idx_t j = 0; j < cols; ++j) dx[j] = s * (y[j] * (dy[j] - dot));
}

void softmax_bwd(const AlignedArray& y, const AlignedArray& dy, idx_t rows, idx_t cols,
                 double scale, AlignedArray* dx) {
  check_softmax_bwd("softmax_bwd", y, dy, rows, cols, *dx);
  const float s = float(scale);
  for_rows(rows, cols, [&](idx_t r) {
    softmax_row_bwd(y.ptr + r * cols, dy.ptr + r * cols, dx->ptr + r * cols, cols, s);
  });
}

// dst (cols x rows) = src (rows x cols)ᵀ.
inline void transpose_into(const float* src, idx_t rows, idx_t cols, float* __restrict__ dst) {
  for (idx_t r = 0; r < rows; ++r)
    for (idx_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// A scratch buffer per thread that grows on demand (per-head transposes).
inline float* head_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Per head h (the heads are shared among the threads): the logits transposed, k qᵀ (keys x
// queries), by the matrix engine (qᵀ copied into a scratch buffer first, so both operands are
// row-major); the masked softmax of W queries at a time along the lanes (softmax_lanes); the
// weights transposed into the head's probs (queries x keys); then out = probs v.
void attention_fwd(const AlignedArray& q, const AlignedArray& k, const AlignedArray& v,
                   idx_t heads, idx_t queries, idx_t dim, idx_t keys, double scale, idx_t causal,
                   AlignedArray* out, AlignedArray* probs) {
  check_attention_fwd("attention_fwd", q, k, v, heads, queries, dim, keys, causal, *out, *probs);
  constexpr idx_t W = vmath::W;
  const idx_t Tq = queries, Tk = keys, D = dim, blocks = (Tq + W - 1) / W;
  const float s = float(scale);
  for_rows(heads, Tq * Tk + (Tq + Tk) * D, [&](idx_t h) {
    float* ph = probs->ptr + h * Tq * Tk;
    float* qt = head_scratch(size_t(D * Tq + Tk * Tq + Tk * W));
    float *st = qt + D * Tq, *zt = st + Tk * Tq;
    transpose_into(q.ptr + h * Tq * D, Tq, D, qt);
    product_on_this_thread(k.ptr + h * Tk * D, qt, st, Tk, D, Tq);  // st[j][i] = q[i] . k[j]
    for (idx_t b = 0; b < blocks; ++b) {
      const idx_t i0 = b * W, lanes = std::min(W, Tq - i0);
      vmath::vi visible;
      for (idx_t l = 0; l < W; ++l)  // a lane past the last query repeats it
        visible[l] = int32_t(softmax_visible(std::min(i0 + l, Tq - 1), Tk, causal ? Tq : 0));
      const vmath::vi seen = visible > 0 ? visible : vmath::vi{} + int32_t(Tk);
      if (lanes == W) {  // a whole block: in place, in the columns i0 .. i0 + W of st
        softmax_lanes(st + i0, Tq, Tk, seen, s);
        continue;
      }
      for (idx_t j = 0; j < Tk; ++j)
        for (idx_t l = 0; l < W; ++l) zt[j * W + l] = st[j * Tq + std::min(i0 + l, Tq - 1)];
      softmax_lanes(zt, W, Tk, seen, s);
      for (idx_t j = 0; j < Tk; ++j)
        for (idx_t l = 0; l < lanes; ++l) st[j * Tq + i0 + l] = zt[j * W + l];
    }
    transpose_into(st, Tk, Tq, ph);
    for (idx_t i = 0; i < Tq; ++i)  // a query that sees no key: uniform, as the course's mask
      if (softmax_visible(i, Tk, causal ? Tq : 0) == 0)
        for (idx_t j = 0; j < Tk; ++j) ph[i * Tk + j] = 1.0f / float(Tk);
    product_on_this_thread(ph, v.ptr + h * Tk * D, out->ptr + h * Tq * D, Tq, Tk, D);
  });
}

// The gradients of attention_fwd from the adjoints d_out of out and d_probs of probs (zeros when
// only out is used), per head: ds = d_out vᵀ + d_probs, the softmax's backward in place (row by
// row), then dq = ds k, dk = dsᵀ q and dv = probsᵀ d_out, each a row-major product (the
// transposed operands copied into scratch first).
void attention_bwd(const AlignedArray& d_out, const AlignedArray& d_probs,
                   const AlignedArray& probs, const AlignedArray& q, const AlignedArray& k,
                   const AlignedArray& v, idx_t heads, idx_t queries, idx_t dim, idx_t keys,
                   double scale, AlignedArray* dq, AlignedArray* dk, AlignedArray* dv) {
  check_attention_bwd("attention_bwd", d_out, d_probs, probs, q, k, v, heads, queries, dim, keys,
                      *dq, *dk, *dv);
  const idx_t Tq = queries, Tk = keys, D = dim;
  const float s = float(scale);
  for_rows(heads, 2 * Tq * Tk + (Tq + Tk) * D, [&](idx_t h) {
    const idx_t qo = h * Tq * D, ko = h * Tk * D, po = h * Tq * Tk;
    const float *ph = probs.ptr + po, *gh = d_out.ptr + qo;
    float* ds = head_scratch(size_t(3 * Tq * Tk + D * Tk));
    float *ts = ds + Tq * Tk, *pt = ts + Tq * Tk, *vt = pt + Tq * Tk;
    transpose_into(v.ptr + ko, Tk, D, vt);
    product_on_this_thread(gh, vt, ds, Tq, D, Tk);
    for (idx_t i = 0; i < Tq * Tk; ++i) ds[i] += d_probs.ptr[po + i];
    for (idx_t i = 0; i < Tq; ++i) softmax_row_bwd(ph + i * Tk, ds + i * Tk, ds + i * Tk, Tk, s);
    product_on_this_thread(ds, k.ptr + ko, dq->ptr + qo, Tq, Tk, D);
    transpose_into(ds, Tq, Tk, ts);
    product_on_this_thread(ts, q.ptr + qo, dk->ptr + ko, Tk, Tq, D);
    transpose_into(ph, Tq, Tk, pt);
    product_on_this_thread(pt, gh, dv->ptr + ko, Tk, Tq, D);
  });
}

}  // namespace fused
}  // namespace needle::cpu
