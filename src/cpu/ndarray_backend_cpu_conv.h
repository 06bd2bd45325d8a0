// The convolution kernels of the CPU module: conv_fwd, conv_input_grad, conv_weight_grad
// (protocol.py; geometry and checks in src/common/ndarray_checks_conv.h).
//
// Each is one call: im2col (or col2im) in C++ around products on the module's matrix engine
// (IsaKernels::gemm: the instruction set picked at import). With the im2col matrix `cols`
// (rows = n·h_out·w_out, depth = kh·kw·c_in; row (b, i, j) is the zero-padded window at
// (i·stride, j·stride), in (kh, kw, c_in) order) and the weight seen as a (depth, c_out) matrix:
//   conv_fwd:         out (rows, c_out)   = cols @ weight
//   conv_weight_grad: out (depth, c_out)  = colsᵀ @ grad
//   conv_input_grad:  dcols (rows, depth) = grad @ weightᵀ, then col2im: each row of dcols is
//                     added back onto the window it came from.
// The im2col matrix is never built whole (but for a batch smaller than the thread count): the
// threads take blocks of about kBlockFloats of it
// (a few hundred rows), each built in a per-thread buffer that stays in cache while one
// single-threaded product reads it; measured on 2 threads, this ran a 32x32x32 -> 32 3x3 layer
// (batch 32) 3.4x faster than im2col into memory followed by one threaded product, and never
// slower at ResNet-9's sizes. A 1x1 kernel at stride 1 without padding needs no im2col: the
// input is its own matrix, and one threaded product does each kernel.
//
// Determinism: every block boundary depends on the sizes only (not on the thread count), the
// weight gradient's partial sums are added in block order and col2im adds in a fixed order per
// image, so a result is the same bit for bit on every run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/ndarray_checks_conv.h"
#include "cpu/ndarray_backend_cpu_alloc.h"
#include "cpu/ndarray_backend_cpu_isa.h"
#include "cpu/ndarray_backend_cpu_threads.h"

namespace needle::cpu {

// Defined in ndarray_backend_cpu.cc: the instruction-set variant in use and the thread pool.
extern const IsaKernels* g_isa;
Runner runner();

namespace conv {

using idx_t = int64_t;
using needle::checks::ConvGeometry;

// Floats of the im2col matrix per block (256 KiB: half an L2 of the machines measured).
constexpr idx_t kBlockFloats = idx_t(1) << 16;
// Fewest rows per block: a few register blocks of the product's micro-kernel.
constexpr idx_t kMinBlockRows = 16;
// Blocks of the weight gradient's rows with a partial sum each (added in order at the end).
constexpr idx_t kWeightGradParts = 16;

// True when the input (n, h, w, c_in) is already the im2col matrix (rows, depth).
inline bool is_pointwise(const ConvGeometry& g) {
  return g.kh == 1 && g.kw == 1 && g.stride == 1 && g.padding == 0;
}

// Rows of the im2col matrix per block.
inline idx_t block_rows(const ConvGeometry& g) {
  return std::max(kMinBlockRows, kBlockFloats / std::max<idx_t>(g.depth(), 1));
}

// C (m, p) = A (m, n) @ B (n, p) for views A, B (MatView strides), on the calling thread only
// (threads = 0: shared among the pool's threads); zeros when n == 0.
inline void product(const MatView& A, const MatView& B, float* C, idx_t m, idx_t n, idx_t p,
                    bool threaded) {
  if (m == 0 || p == 0) return;
  if (n == 0) return std::fill(C, C + m * p, 0.0f);
  Runner run = runner();
  if (!threaded) run.threads = 1;
  g_isa->gemm(A, B, C, 1, m, n, p, run);
}

// A per-thread scratch buffer of at least n floats.
inline float* scratch(idx_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(n)) buf.resize(size_t(n));
  return buf.data();
}

// Rows [r0, r0 + len) of the im2col matrix of x (n, h, w, c_in) into cols (len x depth): for
// each kernel row, the in-range kernel columns are one contiguous copy, the rest zeros.
inline void im2col_rows(const float* x, const ConvGeometry& g, idx_t r0, idx_t len, float* cols) {
  const idx_t cin = g.cin, span = g.kw * cin;
  for (idx_t r = r0; r < r0 + len; ++r) {
    const idx_t j = r % g.wo, i = (r / g.wo) % g.ho, b = r / (g.wo * g.ho);
    const idx_t x0 = j * g.stride - g.padding;  // input column of kernel column 0
    const idx_t lo = std::max<idx_t>(0, -x0), hi = std::min<idx_t>(g.kw, g.w - x0);
    for (idx_t kh = 0; kh < g.kh; ++kh, cols += span) {
      const idx_t y = i * g.stride - g.padding + kh;
      if (y < 0 || y >= g.h || hi <= lo) {
        std::memset(cols, 0, size_t(span) * sizeof(float));
        continue;
      }
      std::memset(cols, 0, size_t(lo * cin) * sizeof(float));
      std::memcpy(cols + lo * cin, x + ((b * g.h + y) * g.w + x0 + lo) * cin,
                  size_t((hi - lo) * cin) * sizeof(float));
      std::memset(cols + hi * cin, 0, size_t((g.kw - hi) * cin) * sizeof(float));
    }
  }
}

// The mirror of im2col_rows: rows [r0, r0 + len) of dcols (len x depth) added onto the input
// adjoint dx (n, h, w, c_in) where their windows lie, one contiguous add per kernel row.
inline void col2im_rows(const float* dcols, const ConvGeometry& g, idx_t r0, idx_t len,
                        float* dx) {
  const idx_t cin = g.cin, span = g.kw * cin;
  for (idx_t r = r0; r < r0 + len; ++r) {
    const idx_t j = r % g.wo, i = (r / g.wo) % g.ho, b = r / (g.wo * g.ho);
    const idx_t x0 = j * g.stride - g.padding;
    const idx_t lo = std::max<idx_t>(0, -x0), hi = std::min<idx_t>(g.kw, g.w - x0);
    for (idx_t kh = 0; kh < g.kh && hi > lo; ++kh) {
      const idx_t y = i * g.stride - g.padding + kh;
      if (y < 0 || y >= g.h) continue;
      float* __restrict__ o = dx + ((b * g.h + y) * g.w + x0 + lo) * cin;
      const float* __restrict__ s = dcols + kh * span + lo * cin;
      for (idx_t e = 0, n = (hi - lo) * cin; e < n; ++e) o[e] += s[e];
    }
    dcols += g.depth();
  }
}

void conv_fwd(const AlignedArray& x, const AlignedArray& weight, idx_t n, idx_t h, idx_t w,
              idx_t c_in, idx_t kh, idx_t kw, idx_t c_out, idx_t stride, idx_t padding,
              AlignedArray* out) {
  const ConvGeometry g = needle::checks::check_conv_fwd("conv_fwd", x, weight, n, h, w, c_in, kh,
                                                        kw, c_out, stride, padding, *out);
  const idx_t depth = g.depth(), rows = g.rows();
  if (rows == 0 || c_out == 0) return;
  const MatView W{weight.ptr, 0, c_out, 1};
  if (is_pointwise(g) || depth == 0)
    return product(MatView{x.ptr, 0, depth, 1}, W, out->ptr, rows, depth, c_out, true);
  const idx_t chunk = block_rows(g);
  parallel_for((rows + chunk - 1) / chunk, [&](idx_t c) {
    const idx_t r0 = c * chunk, len = std::min(chunk, rows - r0);
    float* cols = scratch(len * depth);
    im2col_rows(x.ptr, g, r0, len, cols);
    product(MatView{cols, 0, depth, 1}, W, out->ptr + r0 * c_out, len, depth, c_out, false);
  });
}

void conv_weight_grad(const AlignedArray& x, const AlignedArray& grad, idx_t n, idx_t h, idx_t w,
                      idx_t c_in, idx_t kh, idx_t kw, idx_t c_out, idx_t stride, idx_t padding,
                      AlignedArray* out) {
  const ConvGeometry g = needle::checks::check_conv_weight_grad(
      "conv_weight_grad", x, grad, n, h, w, c_in, kh, kw, c_out, stride, padding, *out);
  const idx_t depth = g.depth(), rows = g.rows(), size = depth * c_out;
  if (size == 0) return;
  const MatView G{grad.ptr, 0, c_out, 1};
  if (is_pointwise(g) || rows == 0)
    return product(MatView{x.ptr, 0, 1, depth}, G, out->ptr, depth, rows, c_out, true);
  const idx_t chunk = block_rows(g);
  const idx_t blocks = (rows + chunk - 1) / chunk;
  if (blocks == 1) {  // one block: built in the caller's scratch, one threaded product
    float* cols = scratch(rows * depth);
    im2col_rows(x.ptr, g, 0, rows, cols);
    return product(MatView{cols, 0, 1, depth}, G, out->ptr, depth, rows, c_out, true);
  }
  // kWeightGradParts contiguous parts of the rows, each summed block by block into its own
  // partial (depth x c_out); the partials are added in order.
  const idx_t per_part = (blocks + kWeightGradParts - 1) / kWeightGradParts;
  const idx_t parts = (blocks + per_part - 1) / per_part;  // none empty
  AlignedArray partial(parts * size);
  parallel_for(parts, [&](idx_t part) {
    float* sum = partial.ptr + part * size;
    const idx_t b0 = part * per_part, b1 = std::min(blocks, b0 + per_part);
    float* cols = scratch(chunk * depth + size);
    float* term = cols + chunk * depth;
    for (idx_t blk = b0; blk < b1; ++blk) {
      const idx_t r0 = blk * chunk, len = std::min(chunk, rows - r0);
      im2col_rows(x.ptr, g, r0, len, cols);
      product(MatView{cols, 0, 1, depth}, MatView{grad.ptr + r0 * c_out, 0, c_out, 1},
              blk == b0 ? sum : term, depth, len, c_out, false);
      if (blk != b0)
        for (idx_t e = 0; e < size; ++e) sum[e] += term[e];
    }
  });
  std::memcpy(out->ptr, partial.ptr, size_t(size) * sizeof(float));
  for (idx_t part = 1; part < parts; ++part) {
    const float* p = partial.ptr + part * size;
    for (idx_t e = 0; e < size; ++e) out->ptr[e] += p[e];
  }
}

void conv_input_grad(const AlignedArray& grad, const AlignedArray& weight, idx_t kh, idx_t kw,
                     idx_t c_in, idx_t c_out, idx_t n, idx_t h, idx_t w, idx_t stride,
                     idx_t padding, AlignedArray* out) {
  const ConvGeometry g = needle::checks::check_conv_input_grad(
      "conv_input_grad", grad, weight, kh, kw, c_in, c_out, n, h, w, stride, padding, *out);
  const idx_t depth = g.depth(), image = g.h * g.w * c_in, per_image = g.ho * g.wo;
  if (g.in_size() == 0) return;
  const MatView Wt{weight.ptr, 0, 1, c_out};
  if (is_pointwise(g))
    return product(MatView{grad.ptr, 0, c_out, 1}, Wt, out->ptr, g.rows(), c_out, depth, true);
  // One task per image (windows of one image overlap, so its additions stay on one thread).
  const idx_t chunk = block_rows(g);
  if (n >= max_threads() && per_image < chunk / 2) {
    // Small images: groups of them, about a block's rows each (the group size depends on the
    // sizes only), each group's dcols computed in a per-thread scratch and added back at once,
    // instead of a dcols of every row (a batch's im2col matrix, held for the whole call).
    const idx_t group = std::max<idx_t>(1, chunk / per_image), rows = group * per_image;
    parallel_for((n + group - 1) / group, [&](idx_t k) {
      const idx_t b0 = k * group, len = std::min(group, n - b0) * per_image;
      std::memset(out->ptr + b0 * image, 0, size_t(len / per_image * image) * sizeof(float));
      float* dcols = scratch(rows * depth);
      product(MatView{grad.ptr + b0 * per_image * c_out, 0, c_out, 1}, Wt, dcols, len, c_out,
              depth, false);
      col2im_rows(dcols, g, b0 * per_image, len, out->ptr);
    });
    return;
  }
  if (n < max_threads()) {
    // Few images: one threaded product for every row, then col2im image by image.
    AlignedArray dcols(g.rows() * depth);
    product(MatView{grad.ptr, 0, c_out, 1}, Wt, dcols.ptr, g.rows(), c_out, depth, true);
    parallel_for(n, [&](idx_t b) {
      std::memset(out->ptr + b * image, 0, size_t(image) * sizeof(float));
      col2im_rows(dcols.ptr + b * per_image * depth, g, b * per_image, per_image, out->ptr);
    });
    return;
  }
  // Large images: each one's rows in blocks, each block's dcols = grad @ weightᵀ in cache and
  // added back at once.
  parallel_for(n, [&](idx_t b) {
    float* dx = out->ptr + b * image;
    std::memset(dx, 0, size_t(image) * sizeof(float));
    float* dcols = scratch(std::min(chunk, per_image) * depth);
    for (idx_t r0 = b * per_image, end = r0 + per_image; r0 < end; r0 += chunk) {
      const idx_t len = std::min(chunk, end - r0);
      product(MatView{grad.ptr + r0 * c_out, 0, c_out, 1}, Wt, dcols, len, c_out, depth, false);
      col2im_rows(dcols, g, r0, len, out->ptr);
    }
  });
}

}  // namespace conv
}  // namespace needle::cpu
