// Fused kernels of the CPU module (the last section of needle/backend_ndarray/protocol.py):
// softmax cross-entropy, layer/batch norm forward and backward, the LSTM cell forward and
// backward, the SGD/Adam updates in place, and the embedding gather and scatter-add. Operands are compact buffers; every binding
// checks that each buffer holds exactly the elements its kernel reads or writes.
//
// Numerics: softmax is shifted by the row maximum (a -inf logit gets probability exactly 0);
// means and variances are two-pass, accumulated in double; sigmoid uses the tanh form, which
// never overflows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/ndarray_backend_cpu_alloc.h"
#include "cpu/ndarray_backend_cpu_isa.h"
#include "cpu/ndarray_backend_cpu_math.h"
#include "cpu/ndarray_backend_cpu_strided.h"
#include "common/ndarray_checks.h"

namespace needle::cpu {

// Defined in ndarray_backend_cpu.cc: the instruction-set variant in use and the thread pool.
extern const IsaKernels* g_isa;
Runner runner();

namespace fused {

using idx_t = int64_t;

// C (m x p) = A (m x n) @ B (n x p), row-major and compact, by the matrix engine on the calling
// thread alone (for kernels that share their own work among the threads: attention's heads,
// the LSTM layer's rows); n == 0 gives zeros.
inline void product_on_this_thread(const float* a, const float* b, float* c, idx_t m, idx_t n,
                                   idx_t p) {
  if (m == 0 || p == 0) return;
  if (n == 0) return std::fill(c, c + m * p, 0.0f);
  Runner one = runner();
  one.threads = 1;
  g_isa->gemm(MatView{a, 0, n, 1}, MatView{b, 0, p, 1}, c, 1, m, n, p, one);
}

using needle::checks::check_batchnorm_fwd;
using needle::checks::check_embedding_gather;
using needle::checks::check_embedding_scatter_add;
using needle::checks::check_ids;
using needle::checks::check_lstm_cell_bwd;
using needle::checks::check_lstm_cell_fwd;
using needle::checks::check_norm_bwd;
using needle::checks::check_norm_fwd;
using needle::checks::check_size;
using needle::checks::check_softmax_xent;
using needle::checks::check_softmax_xent_bwd;
using needle::checks::fail;

inline float sigmoid(float x) { return 0.5f * (std::tanh(0.5f * x) + 1.0f); }

// Σ term(j) over j < n in double, with eight independent accumulators: a single running sum
// waits on each add's latency (about 4 cycles an element); eight vectorise and overlap.
template <class Term>
inline double sum_double(idx_t n, Term term) {
  double acc[8] = {};
  idx_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int u = 0; u < 8; ++u) acc[u] += term(j + u);
  double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; j < n; ++j) s += term(j);
  return s;
}

// Largest of x[0:n] ignoring NaNs (-inf when all are NaN or n == 0), as `x > m ? x : m`, with
// sixteen independent running maxima for the same reason.
inline float max_float(const float* x, idx_t n) {
  float acc[16];
  for (int u = 0; u < 16; ++u) acc[u] = -INFINITY;
  idx_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int u = 0; u < 16; ++u) acc[u] = x[j + u] > acc[u] ? x[j + u] : acc[u];
  float m = -INFINITY;
  for (int u = 0; u < 16; ++u) m = acc[u] > m ? acc[u] : m;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// body(r) for every row r < rows; the rows are shared among threads in tasks of about `task`
// elements, from `from` elements on (default: when there is more than one task). The default
// task suits rows where each element costs several operations, an exp or a normalisation (the
// softmax of 2048 rows of 32 took 125 us on one thread, 64 us on two, measured on a 2-core AMD
// EPYC VM); a memory-bound body, like a copy, passes larger ones.
template <class F>
inline void for_rows(idx_t rows, idx_t cols, F&& body, idx_t task = idx_t(1) << 14,
                     idx_t from = 0) {
  const idx_t c = std::max<idx_t>(cols, 1), per = std::max<idx_t>(1, task / c);
  parallel_ranges(rows, from ? from / c + 1 : per + 1, per, [&](idx_t r0, idx_t r1) {
    for (idx_t r = r0; r < r1; ++r) body(r);
  });
}

// Every label (rows,) a whole number in [0, cols), or a ValueError naming the first that is not.
inline void check_labels(const char* fn, const AlignedArray& labels, idx_t rows, idx_t cols) {
  for (idx_t r = 0; r < rows; ++r) {
    const float l = labels.ptr[r];
    if (!(l >= 0.0f && l < float(cols)) || l != std::floor(l))
      fail(fn, "label " + std::to_string(l) + " of row " + std::to_string(r) +
                   " is not a whole number in [0, " + std::to_string(cols) + ")");
  }
}

void softmax_xent(const AlignedArray& logits, const AlignedArray& labels, idx_t rows, idx_t cols,
                  AlignedArray* loss, AlignedArray* probs) {
  const char* fn = "softmax_xent";
  check_softmax_xent(fn, logits, labels, rows, cols, *loss, *probs);
  check_labels(fn, labels, rows, cols);
  for_rows(rows, cols, [&](idx_t r) {
    const float* x = logits.ptr + r * cols;
    float* e = probs->ptr + r * cols;
    float mx = max_float(x, cols);
    if (!std::isfinite(mx)) mx = 0.0f;  // an all -inf row stays NaN below, as in numpy
    for (idx_t j = 0; j < cols; ++j) e[j] = x[j] - mx;
    vmath::exp_array(e, e, cols);
    const float sf = float(sum_double(cols, [e](idx_t j) { return double(e[j]); }));
    const float inv = 1.0f / sf;
    for (idx_t j = 0; j < cols; ++j) e[j] *= inv;
    loss->ptr[r] = std::log(sf) - (x[idx_t(labels.ptr[r])] - mx);
  });
}

// dlogits may be probs' own buffer: each element is read, then written, by one iteration.
void softmax_xent_bwd(const AlignedArray& probs, const AlignedArray& labels,
                      const AlignedArray& dloss, idx_t rows, idx_t cols, double scale,
                      AlignedArray* dlogits) {
  const char* fn = "softmax_xent_bwd";
  check_softmax_xent_bwd(fn, probs, labels, dloss, rows, cols, *dlogits);
  check_labels(fn, labels, rows, cols);
  const bool shared = dloss.size == 1;
  // memory-bound, like a copy: threads from kParallelCopy elements, in tasks of 64K elements
  const auto row = [&](idx_t r) {
    const float* p = probs.ptr + r * cols;
    float* d = dlogits->ptr + r * cols;
    const float k = dloss.ptr[shared ? 0 : r] * float(scale);  // as numpy: float32 times
    const idx_t label = idx_t(labels.ptr[r]);
    const float at_label = (p[label] - 1.0f) * k;  // read before d (maybe p) is written
    for (idx_t j = 0; j < cols; ++j) d[j] = p[j] * k;
    d[label] = at_label;
  };
  for_rows(rows, cols, row, idx_t(1) << 16, kParallelCopy);
}

// 1 / sqrt(var + eps) as float. The variance of float data above about 2e19 in magnitude does
// not fit a float (it would become inf and the normalised output 0), while its rstd does: such a
// variance is used in double. Every variance a float can hold takes the float arithmetic the
// kernels have always used, so results elsewhere stay bit-identical.
inline float norm_rstd(double var, double eps) {
  const float v = float(var);
  if (std::isfinite(v)) return float(1.0 / std::sqrt(v + float(eps)));
  return float(1.0 / std::sqrt(var + eps));
}

void layernorm_fwd(const AlignedArray& x, const AlignedArray& w, const AlignedArray& b,
                   idx_t rows, idx_t cols, double eps, AlignedArray* y, AlignedArray* xhat,
                   AlignedArray* rstd) {
  check_norm_fwd("layernorm_fwd", x, w, b, rows, cols, rows, *y, *xhat, *rstd);
  for_rows(rows, cols, [&](idx_t r) {
    const float* xr = x.ptr + r * cols;
    const double mean =
        sum_double(cols, [xr](idx_t j) { return double(xr[j]); }) / double(cols);
    const double var = sum_double(cols, [xr, mean](idx_t j) {
                         const double d = double(xr[j]) - mean;
                         return d * d;
                       }) / double(cols);
    const float mu = float(mean), rs = norm_rstd(var, eps);
    rstd->ptr[r] = rs;
    float* hr = xhat->ptr + r * cols;
    float* yr = y->ptr + r * cols;
    for (idx_t j = 0; j < cols; ++j) {
      hr[j] = (xr[j] - mu) * rs;
      yr[j] = hr[j] * w.ptr[j] + b.ptr[j];
    }
  });
}

void layernorm_bwd(const AlignedArray& dy, const AlignedArray& xhat, const AlignedArray& rstd,
                   const AlignedArray& w, idx_t rows, idx_t cols, AlignedArray* dx,
                   AlignedArray* dw, AlignedArray* db) {
  check_norm_bwd("layernorm_bwd", dy, xhat, rstd, w, rows, cols, rows, *dx, *dw, *db);
  for (idx_t j = 0; j < cols; ++j) dw->ptr[j] = db->ptr[j] = 0.0f;
  for (idx_t r = 0; r < rows; ++r) {
    const float *g = dy.ptr + r * cols, *h = xhat.ptr + r * cols;
    const float* wp = w.ptr;
    // sums of dxhat = dy·w and of dxhat·xhat
    const double s1 = sum_double(cols, [g, wp](idx_t j) { return double(g[j] * wp[j]); });
    const double s2 =
        sum_double(cols, [g, wp, h](idx_t j) { return double(g[j] * wp[j]) * h[j]; });
    for (idx_t j = 0; j < cols; ++j) {
      dw->ptr[j] += g[j] * h[j];
      db->ptr[j] += g[j];
    }
    const float m1 = float(s1 / double(cols)), m2 = float(s2 / double(cols)), rs = rstd.ptr[r];
    float* o = dx->ptr + r * cols;
    for (idx_t j = 0; j < cols; ++j) o[j] = rs * (g[j] * w.ptr[j] - m1 - h[j] * m2);
  }
}

void batchnorm_fwd(const AlignedArray& x, const AlignedArray& w, const AlignedArray& b,
                   idx_t rows, idx_t cols, double eps, AlignedArray* y, AlignedArray* xhat,
                   AlignedArray* rstd, AlignedArray* mean, AlignedArray* var) {
  check_batchnorm_fwd("batchnorm_fwd", x, w, b, rows, cols, *y, *xhat, *rstd, *mean, *var);
  // Column statistics accumulated row by row (contiguous, vectorised), in double.
  std::vector<double> s(size_t(cols), 0.0), q(size_t(cols), 0.0);
  for (idx_t r = 0; r < rows; ++r) {
    const float* xr = x.ptr + r * cols;
    for (idx_t j = 0; j < cols; ++j) s[size_t(j)] += xr[j];
  }
  for (idx_t j = 0; j < cols; ++j) s[size_t(j)] /= double(rows);
  for (idx_t r = 0; r < rows; ++r) {
    const float* xr = x.ptr + r * cols;
    for (idx_t j = 0; j < cols; ++j) {
      const double d = xr[j] - s[size_t(j)];
      q[size_t(j)] += d * d;
    }
  }
  for (idx_t j = 0; j < cols; ++j) {
    const double v = q[size_t(j)] / double(rows);
    mean->ptr[j] = float(s[size_t(j)]);
    var->ptr[j] = float(v);
    rstd->ptr[j] = norm_rstd(v, eps);
  }
  for (idx_t r = 0; r < rows; ++r) {
    const float* xr = x.ptr + r * cols;
    float *hr = xhat->ptr + r * cols, *yr = y->ptr + r * cols;
    for (idx_t j = 0; j < cols; ++j) {
      hr[j] = (xr[j] - mean->ptr[j]) * rstd->ptr[j];
      yr[j] = hr[j] * w.ptr[j] + b.ptr[j];
    }
  }
}

void batchnorm_bwd(const AlignedArray& dy, const AlignedArray& xhat, const AlignedArray& rstd,
                   const AlignedArray& w, idx_t rows, idx_t cols, AlignedArray* dx,
                   AlignedArray* dw, AlignedArray* db) {
  check_norm_bwd("batchnorm_bwd", dy, xhat, rstd, w, rows, cols, cols, *dx, *dw, *db);
  std::vector<double> sg(size_t(cols), 0.0), sgh(size_t(cols), 0.0);  // Σ dy, Σ dy·xhat
  for (idx_t r = 0; r < rows; ++r) {
    const float *g = dy.ptr + r * cols, *h = xhat.ptr + r * cols;
    for (idx_t j = 0; j < cols; ++j) {
      sg[size_t(j)] += g[j];
      sgh[size_t(j)] += double(g[j]) * h[j];
    }
  }
  for (idx_t j = 0; j < cols; ++j) {
    db->ptr[j] = float(sg[size_t(j)]);
    dw->ptr[j] = float(sgh[size_t(j)]);
  }
  // dxhat = dy·w; dx = rstd·(dxhat - mean(dxhat) - xhat·mean(dxhat·xhat)), means over rows.
  for (idx_t r = 0; r < rows; ++r) {
    const float *g = dy.ptr + r * cols, *h = xhat.ptr + r * cols;
    float* o = dx->ptr + r * cols;
    for (idx_t j = 0; j < cols; ++j) {
      const float wj = w.ptr[j];
      const float m1 = float(sg[size_t(j)] / double(rows)) * wj;
      const float m2 = float(sgh[size_t(j)] / double(rows)) * wj;
      o[j] = rstd.ptr[j] * (g[j] * wj - m1 - h[j] * m2);
    }
  }
}

// The cell state update c = σf·c_prev + σi·tanh g on `batch` rows from the activations act
// (batch x 4H) (c may be c_prev itself). One function, never inlined, for the forward pass and
// for lstm_layer_bwd's recomputation of the states, so that both give the same bits.
[[gnu::noinline]] inline void cell_state(const float* act, const float* c_prev, idx_t batch,
                                         idx_t H, float* c) {
  for (idx_t r = 0; r < batch; ++r) {
    const float* a = act + r * 4 * H;
    const float *ig = a, *fg = a + H, *gg = a + 2 * H;
    const float* cp = c_prev + r * H;
    float* cr = c + r * H;
    for (idx_t j = 0; j < H; ++j) cr[j] = fg[j] * cp[j] + ig[j] * gg[j];
  }
}

// The LSTM cell on `batch` rows: act (σi, σf, tanh g, σo) from gates (batch x 4H, i, f, g, o;
// act may be gates itself: each element is read before it is written), c = σf·c_prev +
// σi·tanh g (c may be c_prev itself), tanh_c = tanh(c), h = σo·tanh_c (batch x H each).
inline void cell_fwd(const float* gates, const float* c_prev, idx_t batch, idx_t H, float* h,
                     float* c, float* act, float* tanh_c) {
  for (idx_t r = 0; r < batch; ++r) {
    const float* g = gates + r * 4 * H;
    float* a = act + r * 4 * H;
    for (idx_t j = 0; j < 2 * H; ++j) a[j] = g[j] * 0.5f;
    for (idx_t j = 3 * H; j < 4 * H; ++j) a[j] = g[j] * 0.5f;
    for (idx_t j = 2 * H; j < 3 * H; ++j) a[j] = g[j];
    vmath::tanh_array(a, a, 4 * H);
    for (idx_t j = 0; j < 2 * H; ++j) a[j] = 0.5f * (a[j] + 1.0f);
    for (idx_t j = 3 * H; j < 4 * H; ++j) a[j] = 0.5f * (a[j] + 1.0f);
  }
  cell_state(act, c_prev, batch, H, c);
  vmath::tanh_array(c, tanh_c, batch * H);
  for (idx_t r = 0; r < batch; ++r) {
    const float* og = act + r * 4 * H + 3 * H;
    const float* tr = tanh_c + r * H;
    float* hr = h + r * H;
    for (idx_t j = 0; j < H; ++j) hr[j] = og[j] * tr[j];
  }
}

// The exact gradients of cell_fwd: dgates (batch x 4H) and dc_prev (batch x H) from the
// adjoints dh, dc of h and c (dc_prev may be dc itself).
inline void cell_bwd(const float* dh, const float* dc, const float* act, const float* c_prev,
                     const float* tanh_c, idx_t batch, idx_t H, float* dgates, float* dc_prev) {
  for (idx_t r = 0; r < batch; ++r) {
    const float* a = act + r * 4 * H;
    const float *ig = a, *fg = a + H, *gg = a + 2 * H, *og = a + 3 * H;
    const float *dhr = dh + r * H, *dcr = dc + r * H, *cp = c_prev + r * H, *tc = tanh_c + r * H;
    float* d = dgates + r * 4 * H;
    float* dcp = dc_prev + r * H;
    for (idx_t j = 0; j < H; ++j) {
      const float dct = dcr[j] + dhr[j] * og[j] * (1.0f - tc[j] * tc[j]);
      d[j] = dct * gg[j] * ig[j] * (1.0f - ig[j]);
      d[H + j] = dct * cp[j] * fg[j] * (1.0f - fg[j]);
      d[2 * H + j] = dct * ig[j] * (1.0f - gg[j] * gg[j]);
      d[3 * H + j] = dhr[j] * tc[j] * og[j] * (1.0f - og[j]);
      dcp[j] = dct * fg[j];
    }
  }
}

void lstm_cell_fwd(const AlignedArray& gates, const AlignedArray& c_prev, idx_t batch,
                   idx_t hidden, AlignedArray* h, AlignedArray* c, AlignedArray* act,
                   AlignedArray* tanh_c) {
  check_lstm_cell_fwd("lstm_cell_fwd", gates, c_prev, batch, hidden, *h, *c, *act, *tanh_c);
  cell_fwd(gates.ptr, c_prev.ptr, batch, hidden, h->ptr, c->ptr, act->ptr, tanh_c->ptr);
}

void lstm_cell_bwd(const AlignedArray& dh, const AlignedArray& dc, const AlignedArray& act,
                   const AlignedArray& c_prev, const AlignedArray& tanh_c, idx_t batch,
                   idx_t hidden, AlignedArray* dgates, AlignedArray* dc_prev) {
  check_lstm_cell_bwd("lstm_cell_bwd", dh, dc, act, c_prev, tanh_c, batch, hidden, *dgates,
                      *dc_prev);
  cell_bwd(dh.ptr, dc.ptr, act.ptr, c_prev.ptr, tanh_c.ptr, batch, hidden, dgates->ptr,
           dc_prev->ptr);
}

void sgd_update(AlignedArray* param, const AlignedArray& grad, AlignedArray* buf, double lr,
                double momentum, double weight_decay) {
  const char* fn = "sgd_update";
  const idx_t n = param->size;
  check_size(fn, "grad", grad.size, n);
  check_size(fn, "buf", buf->size, n);
  const float lr_f = float(lr), mom = float(momentum), wd = float(weight_decay),
              one_m = float(1.0 - momentum);
  float *p = param->ptr, *b = buf->ptr;
  const float* g = grad.ptr;
  if (momentum == 0.0) {  // buf = g: its previous contents are not read (a scratch will do)
    for (idx_t i = 0; i < n; ++i) {
      const float gi = g[i] + wd * p[i];
      b[i] = gi;
      p[i] -= lr_f * gi;
    }
    return;
  }
  for (idx_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * p[i];
    b[i] = mom * b[i] + one_m * gi;
    p[i] -= lr_f * b[i];
  }
}

void adam_update(AlignedArray* param, const AlignedArray& grad, AlignedArray* m, AlignedArray* v,
                 double lr, double beta1, double beta2, double eps, double weight_decay,
                 idx_t step) {
  const char* fn = "adam_update";
  if (step < 1) fail(fn, "step must be >= 1, got " + std::to_string(step));
  const idx_t n = param->size;
  check_size(fn, "grad", grad.size, n);
  check_size(fn, "m", m->size, n);
  check_size(fn, "v", v->size, n);
  const float b1 = float(beta1), b2 = float(beta2), wd = float(weight_decay);
  const float c1 = float(1.0 - beta1), c2 = float(1.0 - beta2);
  const float bc1 = float(1.0 - std::pow(beta1, double(step)));
  const float bc2 = float(1.0 - std::pow(beta2, double(step)));
  const float lr_f = float(lr), eps_f = float(eps);
  float *p = param->ptr, *mm = m->ptr, *vv = v->ptr;
  const float* g = grad.ptr;
  for (idx_t i = 0; i < n; ++i) {
    const float gi = g[i] + wd * p[i];
    mm[i] = b1 * mm[i] + c1 * gi;
    vv[i] = b2 * vv[i] + c2 * (gi * gi);
    p[i] -= lr_f * (mm[i] / bc1) / (std::sqrt(vv[i] / bc2) + eps_f);
  }
}

// out[r] = weight[ids[r]], one row copy each; the rows are shared among threads when large.
void embedding_gather(const AlignedArray& weight, const AlignedArray& ids, idx_t vocab,
                      idx_t cols, idx_t rows, AlignedArray* out) {
  const char* fn = "embedding_gather";
  check_embedding_gather(fn, weight, ids, vocab, cols, rows, *out);
  check_ids(fn, ids.ptr, rows, vocab);
  if (cols == 0) return;
  for_rows(rows, cols, [&](idx_t r) {
    std::memcpy(out->ptr + r * cols, weight.ptr + idx_t(ids.ptr[r]) * cols,
                size_t(cols) * sizeof(float));
  });
}

// out = zeros, then out[ids[r]] += grad[r] for r = 0, 1, ...: one thread, in row order, so a
// repeated id accumulates in the same order on every run (and as numpy's add.at does).
void embedding_scatter_add(const AlignedArray& grad, const AlignedArray& ids, idx_t rows,
                           idx_t cols, idx_t vocab, AlignedArray* out) {
  const char* fn = "embedding_scatter_add";
  check_embedding_scatter_add(fn, grad, ids, rows, cols, vocab, *out);
  check_ids(fn, ids.ptr, rows, vocab);
  if (vocab * cols > 0) std::memset(out->ptr, 0, size_t(vocab * cols) * sizeof(float));
  for (idx_t r = 0; r < rows; ++r) {
    float* o = out->ptr + idx_t(ids.ptr[r]) * cols;
    const float* g = grad.ptr + r * cols;
    for (idx_t j = 0; j < cols; ++j) o[j] += g[j];
  }
}

}  // namespace fused
}  // namespace needle::cpu
