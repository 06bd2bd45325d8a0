// Strided copies for the CPU backend: compact, ewise_setitem, scalar_setitem, to_numpy.
//
// A strided view is (shape, strides in elements, offset) over a flat buffer. Strides may be
// zero (broadcast) or negative (NDArray.flip). Every entry point first checks that the whole
// view lies inside the buffer, then walks it as runs along the innermost dimension.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/ndarray_backend_cpu_threads.h"
#include "common/ndarray_checks.h"

namespace needle::cpu {

using idx_t = int64_t;

inline std::string vec_str(const std::vector<idx_t>& v) { return needle::checks::tuple_str(v); }

// Element counts above which memory-bound loops use every thread.
constexpr idx_t kParallelCopy = idx_t(1) << 17;

// f(begin, end) over [0, n): one call below `threshold` elements (or with one thread), else
// chunks of `grain` claimed by the calling thread and the pool's idle workers. f must be safe
// to run concurrently on disjoint ranges.
template <class F>
inline void parallel_ranges(idx_t n, idx_t threshold, idx_t grain, F&& f) {
  if (n <= 0) return;
  if (n < threshold || n <= grain || max_threads() <= 1) {
    f(idx_t(0), n);
    return;
  }
  auto chunk = [&](int64_t c) { f(c * grain, std::min(n, (c + 1) * grain)); };
  parallel_for((n + grain - 1) / grain, chunk);
}

// A view with size-1 dimensions dropped and mergeable neighbours fused, so the innermost
// run is as long as possible (a transposed 2-D view stays 2-D; a compact one becomes 1-D).
struct View {
  std::vector<idx_t> shape, strides;
  idx_t offset = 0;
  idx_t size = 1;
};

// The view (shape, strides, offset) of `size` elements with size-1 dimensions dropped and
// mergeable neighbours fused (no checks).
inline View simplified(const std::vector<idx_t>& shape, const std::vector<idx_t>& strides,
                       idx_t offset, idx_t size) {
  View v;
  v.offset = offset;
  v.size = size;
  if (v.size == 0) return v;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!v.shape.empty() && v.strides.back() == strides[d] * shape[d]) {
      v.shape.back() *= shape[d];
      v.strides.back() = strides[d];
    } else {
      v.shape.push_back(shape[d]);
      v.strides.push_back(strides[d]);
    }
  }
  if (v.shape.empty()) {
    v.shape.push_back(1);
    v.strides.push_back(1);
  }
  return v;
}

// Checks the view against a buffer of `buf_size` elements (ValueError naming the sizes when
// it leaves the buffer) and returns its simplified form.
inline View make_view(const char* fn, const std::vector<idx_t>& shape,
                      const std::vector<idx_t>& strides, idx_t offset, idx_t buf_size) {
  return simplified(shape, strides, offset,
                    needle::checks::check_view(fn, shape, strides, offset, buf_size));
}

// Calls f(flat_pos, buffer_offset, count, inner_stride) for each innermost run of the view
// whose row-major positions lie in [begin, end).
template <class F>
inline void for_runs(const View& v, idx_t begin, idx_t end, F&& f) {
  const int nd = int(v.shape.size());
  std::vector<idx_t> idx(nd, 0);
  idx_t rem = begin, off = v.offset;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % v.shape[d];
    rem /= v.shape[d];
    off += idx[d] * v.strides[d];
  }
  const idx_t n_in = v.shape[nd - 1], s_in = v.strides[nd - 1];
  idx_t pos = begin;
  while (pos < end) {
    idx_t count = std::min(n_in - idx[nd - 1], end - pos);
    f(pos, off, count, s_in);
    pos += count;
    off += count * s_in;
    idx[nd - 1] += count;
    for (int d = nd - 1; d > 0 && idx[d] == v.shape[d]; --d) {
      off -= idx[d] * v.strides[d];
      idx[d] = 0;
      ++idx[d - 1];
      off += v.strides[d - 1];
    }
  }
}

// Runs for_runs over the whole view, split across threads when it is large; each position
// of the view stands for `per` elements of work (the rows of for_short_rows).
template <class F>
inline void for_runs_parallel(const View& v, bool allow_parallel, F&& f, idx_t per = 1) {
  const idx_t threshold = allow_parallel ? std::max<idx_t>(1, kParallelCopy / per) : v.size + 1;
  parallel_ranges(v.size, threshold, std::max<idx_t>(1, (idx_t(1) << 16) / per),
                  [&](idx_t b, idx_t e) { for_runs(v, b, e, f); });
}

// Transposed 2-D views (inner stride far from 1) are copied in square blocks so that both
// the reads and the writes stay in cache; returns false when the view is not of that form.
inline bool blocked_2d_applies(const View& v) {
  if (v.shape.size() != 2) return false;
  const idx_t sc = v.strides[1];
  return !(sc == 1 || sc == 0 || sc == -1 || v.shape[0] < 16 || v.shape[1] < 16);
}

inline bool compact_blocked_2d(const float* a, float* out, const View& v) {
  if (!blocked_2d_applies(v)) return false;
  const idx_t R = v.shape[0], C = v.shape[1], sr = v.strides[0], sc = v.strides[1];
  constexpr idx_t B = 32;
  const idx_t nbr = (R + B - 1) / B, nbc = (C + B - 1) / B;
  parallel_ranges(nbr * nbc, kParallelCopy / (B * B), 16, [=](idx_t b0, idx_t b1) {
    for (idx_t b = b0; b < b1; ++b) {
      const idx_t bi = b / nbc, bj = b % nbc;
      const idx_t i1 = std::min(R, bi * B + B), j1 = std::min(C, bj * B + B);
      for (idx_t i = bi * B; i < i1; ++i) {
        const float* src = a + v.offset + i * sr;
        float* dst = out + i * C;
        for (idx_t j = bj * B; j < j1; ++j) dst[j] = src[j * sc];
      }
    }
  });
  return true;
}

// d[0:n] = s[0:n] for a short row; W > 0 fixes n at compile time (a few vector moves).
template <int W>
inline void copy_row(float* __restrict__ d, const float* __restrict__ s, idx_t n) {
  if (W > 0) {
    std::memcpy(d, s, size_t(W) * sizeof(float));
  } else {
    for (idx_t j = 0; j < n; ++j) d[j] = s[j];
  }
}

// Calls body(std::integral_constant<int, W>) with W = w for the common row lengths, else 0.
template <class Body>
inline void dispatch_row_width(idx_t w, Body&& body) {
  switch (w) {
    case 4: return body(std::integral_constant<int, 4>());
    case 8: return body(std::integral_constant<int, 8>());
    case 16: return body(std::integral_constant<int, 16>());
    case 32: return body(std::integral_constant<int, 32>());
    default: return body(std::integral_constant<int, 0>());
  }
}

// The view without its `k` innermost dimensions (a 0-d remainder becomes shape (1,)).
inline View outer_view(const View& v, size_t k) {
  View o;
  o.shape.assign(v.shape.begin(), v.shape.end() - k);
  o.strides.assign(v.strides.begin(), v.strides.end() - k);
  o.offset = v.offset;
  o.size = 1;
  for (idx_t n : o.shape) o.size *= n;
  if (o.shape.empty()) {
    o.shape.push_back(1);
    o.strides.push_back(0);
  }
  return o;
}

// Short contiguous inner rows (the tiled layouts of matmul have rows of 8) are walked in
// blocks of rows, the index bookkeeping paid once per block: for_short_rows calls
// row(r, off) for each row of the view, r its row-major index, off its offset in the buffer.
constexpr idx_t kShortRow = 64;
inline bool short_rows(const View& v) {
  return v.shape.size() >= 2 && v.strides.back() == 1 && v.shape.back() <= kShortRow;
}

template <class Row>
inline void for_short_rows(const View& v, bool allow_parallel, Row row) {
  const size_t nd = v.shape.size();
  const idx_t rows = v.shape[nd - 2], srow = v.strides[nd - 2];
  const View blocks = outer_view(v, 2);
  auto block_run = [row, rows, srow](idx_t pos, idx_t off, idx_t n, idx_t s) {
    for (idx_t e = 0; e < n; ++e) {
      const idx_t r0 = (pos + e) * rows, o0 = off + e * s;
      for (idx_t r = 0; r < rows; ++r) row(r0 + r, o0 + r * srow);
    }
  };
  for_runs_parallel(blocks, allow_parallel, block_run, rows * v.shape[nd - 1]);
}

// out[0:size] = the view of a, in row-major order. out must not overlap the view.
inline void compact_into(const float* a, float* out, const View& v) {
  if (v.size == 0) return;
  if (compact_blocked_2d(a, out, v)) return;
  if (short_rows(v)) {
    const idx_t w = v.shape.back();
    dispatch_row_width(w, [&](auto W) {
      constexpr int kWidth = decltype(W)::value;  // a constant: the row lambda needs no capture
      for_short_rows(v, true, [out, a, w](idx_t r, idx_t off) {
        copy_row<kWidth>(out + r * w, a + off, w);
      });
    });
    return;
  }
  for_runs_parallel(v, true, [&](idx_t pos, idx_t off, idx_t n, idx_t s) {
    const float* src = a + off;
    float* dst = out + pos;
    if (s == 1) {
      std::memcpy(dst, src, size_t(n) * sizeof(float));
    } else if (s == 0) {
      std::fill(dst, dst + n, *src);
    } else {
      for (idx_t j = 0; j < n; ++j) dst[j] = src[j * s];
    }
  });
}

// True when two distinct positions of the view may share an element (a zero stride, or
// strides that fold back onto themselves); writes through such a view stay sequential so the
// last write wins, as in numpy.
inline bool view_may_self_overlap(const View& v) {
  std::vector<std::pair<idx_t, idx_t>> dims;  // (|stride|, size)
  for (size_t d = 0; d < v.shape.size(); ++d)
    if (v.shape[d] > 1) dims.emplace_back(v.strides[d] < 0 ? -v.strides[d] : v.strides[d], v.shape[d]);
  std::sort(dims.begin(), dims.end());
  idx_t span = 1;  // elements covered by the dimensions so far
  for (auto& [s, n] : dims) {
    if (s < span) return true;
    span = s * (n - 1) + span;
  }
  return false;
}

// The view of out = a[0:size] (row-major).
inline void setitem_from(const float* a, float* out, const View& v) {
  if (v.size == 0) return;
  const bool overlap = view_may_self_overlap(v);
  if (short_rows(v) && !overlap) {
    const idx_t w = v.shape.back();
    dispatch_row_width(w, [&](auto W) {
      constexpr int kWidth = decltype(W)::value;  // a constant: the row lambda needs no capture
      for_short_rows(v, true, [out, a, w](idx_t r, idx_t off) {
        copy_row<kWidth>(out + off, a + r * w, w);
      });
    });
    return;
  }
  for_runs_parallel(v, !overlap, [&](idx_t pos, idx_t off, idx_t n, idx_t s) {
    const float* src = a + pos;
    float* dst = out + off;
    if (s == 1) {
      std::memmove(dst, src, size_t(n) * sizeof(float));
    } else if (s == 0) {
      *dst = src[n - 1];
    } else {
      for (idx_t j = 0; j < n; ++j) dst[j * s] = src[j];
    }
  });
}

// The view of out = val.
inline void setitem_scalar(float val, float* out, const View& v) {
  if (v.size == 0) return;
  for_runs_parallel(v, !view_may_self_overlap(v), [&](idx_t, idx_t off, idx_t n, idx_t s) {
    float* dst = out + off;
    if (s == 1) {
      std::fill(dst, dst + n, val);
    } else if (s == 0) {
      *dst = val;
    } else {
      for (idx_t j = 0; j < n; ++j) dst[j * s] = val;
    }
  });
}

}  // namespace needle::cpu
