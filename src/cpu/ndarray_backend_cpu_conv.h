// The convolution kernels of the CPU module: conv_fwd, conv_input_grad, conv_weight_grad
// (protocol.py; geometry and checks in src/common/ndarray_checks_conv.h).
//
// Each is one call: im2col (or col2im) in C++ plus one product on the module's matrix engine
// (IsaKernels::gemm: packing, threads, the instruction set picked at import). With the
// im2col matrix `cols` (rows = n·h_out·w_out, depth = kh·kw·c_in; row (b, i, j) is the
// zero-padded window at (i·stride, j·stride), in (kh, kw, c_in) order) and the weight seen as
// a (depth, c_out) matrix:
//   conv_fwd:         out (rows, c_out)   = cols @ weight
//   conv_weight_grad: out (depth, c_out)  = colsᵀ @ grad          (colsᵀ read strided)
//   conv_input_grad:  dcols (rows, depth) = grad @ weightᵀ        (weightᵀ read strided),
//                     then col2im: each input element sums the dcols entries that read it.
// A 1x1 kernel at stride 1 without padding needs no im2col: the input is its own matrix.
// col2im gathers per input element (no two threads write one element), so every result is
// the same bit for bit on every run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/ndarray_checks_conv.h"
#include "cpu/ndarray_backend_cpu_alloc.h"
#include "cpu/ndarray_backend_cpu_fused.h"
#include "cpu/ndarray_backend_cpu_isa.h"

namespace needle::cpu {

// Defined in ndarray_backend_cpu.cc: the instruction-set variant in use and the thread pool.
extern const IsaKernels* g_isa;
Runner runner();

namespace conv {

using idx_t = int64_t;
using needle::checks::ConvGeometry;

// True when the input (n, h, w, c_in) is already the im2col matrix (rows, depth).
inline bool is_pointwise(const ConvGeometry& g) {
  return g.kh == 1 && g.kw == 1 && g.stride == 1 && g.padding == 0;
}

// C (m, p) = A (m, n) @ B (n, p) for views A, B (MatView strides); zeros when n == 0.
inline void product(const MatView& A, const MatView& B, float* C, idx_t m, idx_t n, idx_t p) {
  if (m == 0 || p == 0) return;
  if (n == 0) return std::fill(C, C + m * p, 0.0f);
  g_isa->gemm(A, B, C, 1, m, n, p, runner());
}

// cols (rows, depth) = the zero-padded windows of x (n, h, w, c_in), one output line (b, i)
// per task; for each kernel row, the in-range kernel columns are one contiguous copy.
inline void im2col(const float* x, const ConvGeometry& g, float* cols) {
  const idx_t depth = g.depth(), cin = g.cin, line = g.wo * depth;
  fused::for_rows(g.n * g.ho, line, [&](idx_t bi) {
    const idx_t b = bi / g.ho, i = bi % g.ho;
    float* dst = cols + bi * line;
    for (idx_t j = 0; j < g.wo; ++j) {
      const idx_t x0 = j * g.stride - g.padding;  // input column of kernel column 0
      const idx_t lo = std::max<idx_t>(0, -x0), hi = std::min<idx_t>(g.kw, g.w - x0);
      for (idx_t kh = 0; kh < g.kh; ++kh, dst += g.kw * cin) {
        const idx_t y = i * g.stride - g.padding + kh;
        if (y < 0 || y >= g.h || hi <= lo) {
          std::memset(dst, 0, size_t(g.kw * cin) * sizeof(float));
          continue;
        }
        if (lo > 0) std::memset(dst, 0, size_t(lo * cin) * sizeof(float));
        std::memcpy(dst + lo * cin, x + ((b * g.h + y) * g.w + x0 + lo) * cin,
                    size_t((hi - lo) * cin) * sizeof(float));
        if (hi < g.kw) std::memset(dst + hi * cin, 0, size_t((g.kw - hi) * cin) * sizeof(float));
      }
    }
  });
}

// dx (n, h, w, c_in) = col2im(dcols): element (b, y, x, c) sums dcols[(b, i, j), (kh, kw, c)]
// over the windows (i, j) and offsets (kh, kw) with i·stride + kh - padding = y (likewise x),
// in the order kh, kw; one input line (b, y) per task.
inline void col2im(const float* dcols, const ConvGeometry& g, float* dx) {
  const idx_t depth = g.depth(), cin = g.cin, s = g.stride, p = g.padding;
  fused::for_rows(g.n * g.h, g.w * cin * std::max<idx_t>(1, g.kh * g.kw / (s * s)), [&](idx_t by) {
    const idx_t b = by / g.h, y = by % g.h;
    float* out = dx + by * g.w * cin;
    std::memset(out, 0, size_t(g.w * cin) * sizeof(float));
    for (idx_t kh = 0; kh < g.kh; ++kh) {
      const idx_t ti = y + p - kh;  // = i·stride
      if (ti < 0 || ti % s || ti / s >= g.ho) continue;
      const float* row = dcols + (b * g.ho + ti / s) * g.wo * depth + kh * g.kw * cin;
      for (idx_t xx = 0; xx < g.w; ++xx) {
        float* o = out + xx * cin;
        for (idx_t kw = 0; kw < g.kw; ++kw) {
          const idx_t tj = xx + p - kw;  // = j·stride
          if (tj < 0 || tj % s || tj / s >= g.wo) continue;
          const float* src = row + (tj / s) * depth + kw * cin;
          for (idx_t c = 0; c < cin; ++c) o[c] += src[c];
        }
      }
    }
  });
}

void conv_fwd(const AlignedArray& x, const AlignedArray& weight, idx_t n, idx_t h, idx_t w,
              idx_t c_in, idx_t kh, idx_t kw, idx_t c_out, idx_t stride, idx_t padding,
              AlignedArray* out) {
  const ConvGeometry g = needle::checks::check_conv_fwd("conv_fwd", x, weight, n, h, w, c_in, kh,
                                                        kw, c_out, stride, padding, *out);
  const idx_t depth = g.depth(), rows = g.rows();
  if (rows == 0 || c_out == 0) return;
  const MatView W{weight.ptr, 0, c_out, 1};
  if (is_pointwise(g)) return product(MatView{x.ptr, 0, depth, 1}, W, out->ptr, rows, depth, c_out);
  AlignedArray cols(rows * depth);
  im2col(x.ptr, g, cols.ptr);
  product(MatView{cols.ptr, 0, depth, 1}, W, out->ptr, rows, depth, c_out);
}

void conv_weight_grad(const AlignedArray& x, const AlignedArray& grad, idx_t n, idx_t h, idx_t w,
                      idx_t c_in, idx_t kh, idx_t kw, idx_t c_out, idx_t stride, idx_t padding,
                      AlignedArray* out) {
  const ConvGeometry g = needle::checks::check_conv_weight_grad(
      "conv_weight_grad", x, grad, n, h, w, c_in, kh, kw, c_out, stride, padding, *out);
  const idx_t depth = g.depth(), rows = g.rows();
  if (depth == 0 || c_out == 0) return;
  const MatView G{grad.ptr, 0, c_out, 1};
  if (is_pointwise(g)) return product(MatView{x.ptr, 0, 1, depth}, G, out->ptr, depth, rows, c_out);
  AlignedArray cols(rows * depth);
  im2col(x.ptr, g, cols.ptr);
  product(MatView{cols.ptr, 0, 1, depth}, G, out->ptr, depth, rows, c_out);
}

void conv_input_grad(const AlignedArray& grad, const AlignedArray& weight, idx_t kh, idx_t kw,
                     idx_t c_in, idx_t c_out, idx_t n, idx_t h, idx_t w, idx_t stride,
                     idx_t padding, AlignedArray* out) {
  const ConvGeometry g = needle::checks::check_conv_input_grad(
      "conv_input_grad", grad, weight, kh, kw, c_in, c_out, n, h, w, stride, padding, *out);
  const idx_t depth = g.depth(), rows = g.rows();
  if (g.in_size() == 0) return;
  const MatView G{grad.ptr, 0, c_out, 1}, Wt{weight.ptr, 0, 1, c_out};
  if (is_pointwise(g)) return product(G, Wt, out->ptr, rows, c_out, depth);
  AlignedArray dcols(rows * depth);
  product(G, Wt, dcols.ptr, rows, c_out, depth);
  col2im(dcols.ptr, g, out->ptr);
}

}  // namespace conv
}  // namespace needle::cpu
