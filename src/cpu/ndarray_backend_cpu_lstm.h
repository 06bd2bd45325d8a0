// An LSTM layer over a whole sequence, one call each way (lstm_layer_fwd / lstm_layer_bwd of
// protocol.py): the loop over the time steps runs here, not in Python, so a layer of T steps
// costs one device call instead of about four per step.
//
// Forward, per step t: act[t] = h_{t-1} @ w_hh (the module's matrix engine), act[t] += xw[t],
// then the cell of ndarray_backend_cpu_fused.h in place over act[t] (pre-activations become
// activations) and over c; out[t] = h_t. Only act and out are kept for the backward pass
// (besides the inputs): the cell states c_t and tanh(c_t) are recomputed from act by the
// backward pass, with the same functions, so they are the same bits (c_t = σf·c_{t-1} +
// σi·tanh g, one multiply-add per element and step: far cheaper than keeping (T, B, H) more
// floats alive from the forward pass to the backward pass).
// Backward: the states c_0 .. c_{T-1} into a scratch buffer, then for t = T-1 .. 0 the cell's
// gradient with dh_t = dh + d_out[t] into dxw[t] and dh = dxw[t] @ w_hhᵀ (w_hh transposed once
// per call); at the end dw_hh = h_prevᵀ @ dxw as one product over the stacked states h_prev =
// (h0, out[0], ..., out[T-2]).
//
// Threads: a batch row's recurrence involves that row alone (row r of h_t @ w_hh reads row r of
// h_t only), so the rows are split among the pool's threads for the whole sequence, each thread
// running every step of its rows with no wait between steps: at the course LSTM LM's sizes
// (T = 32, batch 16, hidden 128) two threads run 8 rows each. Each step's product runs on its
// row block's thread, the same chain of multiply-adds per element as a product of all rows
// (results do not depend on the thread count or the split). Measured on the 2-core AMD EPYC VM,
// forward and backward of that layer: 0.68 and 1.09 ms with each step's product shared between
// the threads and the cell on one, 0.99 and 1.33 ms on one thread. The final weight-gradient
// product is shared among the pool's threads as any other.
#pragma once

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "common/ndarray_checks.h"
#include "cpu/ndarray_backend_cpu_alloc.h"
#include "cpu/ndarray_backend_cpu_fused.h"
#include "cpu/ndarray_backend_cpu_isa.h"
#include "cpu/ndarray_backend_cpu_math.h"
#include "cpu/ndarray_backend_cpu_strided.h"
#include "cpu/ndarray_backend_cpu_threads.h"

namespace needle::cpu {

namespace fused {

using needle::checks::check_lstm_layer_bwd;
using needle::checks::check_lstm_layer_fwd;

// body(r0, r1) for blocks of the batch rows [0, batch), one block per thread, while sharing is
// not paused; a worker that keeps the caller waiting longer than kSplitStallNs after its own
// block (preempted by another process) pauses it, as it pauses the engine's shared products.
template <class F>
inline void for_row_blocks(idx_t batch, F&& body) {
  const idx_t threads = g_isa->sharing_allowed() ? max_threads() : 1;
  const idx_t blocks = std::max<idx_t>(1, std::min<idx_t>(batch, threads));
  if (blocks == 1) return body(0, batch);
  using clock = std::chrono::steady_clock;
  const pthread_t caller = pthread_self();
  clock::time_point own_end{};  // written by the caller only
  auto block = [&](int64_t k) {
    body(batch * k / blocks, batch * (k + 1) / blocks);
    if (pthread_equal(pthread_self(), caller)) own_end = clock::now();
  };
  parallel_for(blocks, block);
  if (own_end != clock::time_point{} &&
      std::chrono::duration<double, std::nano>(clock::now() - own_end).count() > kSplitStallNs)
    g_isa->sharing_stalled();
}

inline void copy_floats(float* dst, const float* src, idx_t n) {
  if (n > 0) std::memcpy(dst, src, size_t(n) * sizeof(float));
}

void lstm_layer_fwd(const AlignedArray& xw, const AlignedArray& h0, const AlignedArray& c0,
                    const AlignedArray& w_hh, idx_t batch, idx_t hidden, idx_t steps,
                    AlignedArray* out, AlignedArray* h, AlignedArray* c, AlignedArray* act) {
  check_lstm_layer_fwd("lstm_layer_fwd", xw, h0, c0, w_hh, batch, hidden, steps, *out, *h, *c,
                       *act);
  const idx_t H = hidden, n = batch * hidden, n4 = 4 * n;
  if (n == 0) return;  // every output is empty
  for_row_blocks(batch, [&](idx_t r0, idx_t r1) {
    const idx_t rows = r1 - r0, at = r0 * H, at4 = r0 * 4 * H;
    AlignedArray tanh_c(rows * H);
    float* cr = c->ptr + at;  // c carries c_t of these rows from step to step
    copy_floats(cr, c0.ptr + at, rows * H);
    const float* hp = h0.ptr + at;
    for (idx_t t = 0; t < steps; ++t) {
      float* g = act->ptr + t * n4 + at4;
      product_on_this_thread(hp, w_hh.ptr, g, rows, H, 4 * H);
      const float* x = xw.ptr + t * n4 + at4;
      for (idx_t i = 0; i < rows * 4 * H; ++i) g[i] += x[i];
      float* ht = out->ptr + t * n + at;
      cell_fwd(g, cr, rows, H, ht, cr, g, tanh_c.ptr);
      hp = ht;
    }
    copy_floats(h->ptr + at, hp, rows * H);
  });
}

void lstm_layer_bwd(const AlignedArray& d_out, const AlignedArray& dh, const AlignedArray& dc,
                    const AlignedArray& act, const AlignedArray& out, const AlignedArray& h0,
                    const AlignedArray& c0, const AlignedArray& w_hh, idx_t batch, idx_t hidden,
                    idx_t steps, AlignedArray* dxw, AlignedArray* dh0, AlignedArray* dc0,
                    AlignedArray* dw_hh) {
  check_lstm_layer_bwd("lstm_layer_bwd", d_out, dh, dc, act, out, h0, c0, w_hh, batch, hidden,
                       steps, *dxw, *dh0, *dc0, *dw_hh);
  const idx_t H = hidden, n = batch * hidden, n4 = 4 * n;
  // dh0 and dc0 carry the running adjoints of h_t and c_t through the steps
  copy_floats(dh0->ptr, dh.ptr, n);
  copy_floats(dc0->ptr, dc.ptr, n);
  if (n == 0 || steps == 0) {  // no product: the weight gradient is zero
    std::fill(dw_hh->ptr, dw_hh->ptr + dw_hh->size, 0.0f);
    return;
  }
  AlignedArray c_all(steps * n);  // c_t of every step, as the forward pass computed them
  AlignedArray w_t(4 * H * H);      // w_t = w_hhᵀ, by compact's blocked transpose
  compact_into(w_hh.ptr, w_t.ptr, simplified({4 * H, H}, {1, 4 * H}, 0, 4 * H * H));
  for_row_blocks(batch, [&](idx_t r0, idx_t r1) {
    const idx_t rows = r1 - r0, at = r0 * H, at4 = r0 * 4 * H;
    for (idx_t t = 0; t < steps; ++t)
      cell_state(act.ptr + t * n4 + at4, (t > 0 ? c_all.ptr + (t - 1) * n : c0.ptr) + at, rows, H,
                 c_all.ptr + t * n + at);
    AlignedArray work(2 * rows * H);
    float *dh_t = work.ptr, *tanh_c = work.ptr + rows * H;
    float *dh = dh0->ptr + at, *dc = dc0->ptr + at;
    for (idx_t t = steps - 1; t >= 0; --t) {
      const float* d = d_out.ptr + t * n + at;
      for (idx_t i = 0; i < rows * H; ++i) dh_t[i] = dh[i] + d[i];
      vmath::tanh_array(c_all.ptr + t * n + at, tanh_c, rows * H);
      const float* cp = (t > 0 ? c_all.ptr + (t - 1) * n : c0.ptr) + at;
      float* dg = dxw->ptr + t * n4 + at4;
      cell_bwd(dh_t, dc, act.ptr + t * n4 + at4, cp, tanh_c, rows, H, dg, dc);
      product_on_this_thread(dg, w_t.ptr, dh, rows, 4 * H, H);
    }
  });
  // dw_hh (H x 4H) = h_prevᵀ (H x steps·batch) @ dxw (steps·batch x 4H); c_all's buffer is
  // free now and holds h_prev
  float* h_prev = c_all.ptr;
  copy_floats(h_prev, h0.ptr, n);
  copy_floats(h_prev + n, out.ptr, (steps - 1) * n);
  g_isa->gemm(MatView{h_prev, 0, 1, H}, MatView{dxw->ptr, 0, 4 * H, 1}, dw_hh->ptr, 1, H,
              steps * batch, 4 * H, runner());
}

}  // namespace fused
}  // namespace needle::cpu
