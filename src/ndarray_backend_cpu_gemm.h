// Single-precision matrix multiplication for the CPU backend: C (m, p) = A (m, n) @ B (n, p).
//
// The Goto/BLIS structure, with B packed whole up front:
//   pack B, for every K panel pc (KC rows): NR-wide slivers, [k][NR] each
//   for each task (MC rows of C, a group of B slivers):
//     for pc in n by KC:          pack A (MC x KC) into MR-tall slivers, [k][MR] each
//       for (jr, ir) slivers:     micro-kernel: an MR x NR block of C held in registers
// A B sliver (KC x NR) stays in L1 while the A slivers of the block (in L2) stream past it.
// The micro-kernel uses AVX-512 or AVX2+FMA intrinsics when the compiler targets them, and a
// plain loop nest that the compiler vectorises on its own everywhere else. Partial slivers
// are zero-padded when packed and the edges of C use narrower kernels through a small
// buffer. Threads (ndarray_backend_cpu_threads.h) claim B units and C tasks dynamically, and
// only for products large enough to repay the start-up.
//
// Operands are read through a Layout: row-major with a leading dimension, or the tiled
// layout of NDArray.__matmul__ ((rows/T, cols/T, T, T), compact), so matmul_tiled packs from
// its tiles directly and runs the same engine.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <thread>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#include "ndarray_backend_cpu_threads.h"

namespace needle_cpu {
namespace gemm {

using idx_t = int64_t;

// Block sizes: an NR-wide sliver of a packed B panel (KC x NR) stays in L1 while the MR-tall
// slivers of the packed A block (MC x KC) stream past it from L2; the packed B panels sit in
// L2/L3. NEEDLE_GEMM_KC / NEEDLE_GEMM_MC override them (for tuning).
#if defined(__AVX512F__)
constexpr int MR = 12, NR = 32;
constexpr idx_t kDefaultKC = 256, kDefaultMC = 96;
constexpr const char* kKernelName = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int MR = 6, NR = 16;
constexpr idx_t kDefaultKC = 256, kDefaultMC = 72;
constexpr const char* kKernelName = "avx2-fma";
#else
constexpr int MR = 4, NR = 16;
constexpr idx_t kDefaultKC = 256, kDefaultMC = 64;
constexpr const char* kKernelName = "portable";
#endif
#ifdef NEEDLE_GEMM_KC
constexpr idx_t KC = NEEDLE_GEMM_KC;
#else
constexpr idx_t KC = kDefaultKC;
#endif
#ifdef NEEDLE_GEMM_MC
constexpr idx_t MC = NEEDLE_GEMM_MC;
#else
constexpr idx_t MC = kDefaultMC;
#endif
static_assert(MC % MR == 0, "MC must be a multiple of MR");

// m*n*p above which the product runs on every thread (about 128^3: below it the
// fork/join costs about as much as the second thread saves).
#ifndef NEEDLE_GEMM_PARALLEL_FLOPS
#define NEEDLE_GEMM_PARALLEL_FLOPS (1 << 21)
#endif
constexpr double kParallelFlops = NEEDLE_GEMM_PARALLEL_FLOPS;

// An operand: row-major (tile == 0, element (i, k) at ptr[i*ld + k]) or tiled
// (element (i, k) in tile (i/T, k/T) of a (rows/T, cols/T, T, T) compact array).
struct Layout {
  float* ptr;
  idx_t ld;               // row-major: row stride
  idx_t tile = 0;         // tiled: T
  idx_t tiles_per_row = 0;  // tiled: cols / T

  float* addr(idx_t i, idx_t k) const {
    if (!tile) return ptr + i * ld + k;
    return ptr + (((i / tile) * tiles_per_row + k / tile) * tile + i % tile) * tile + k % tile;
  }
  // How many elements from (i, k) along the row are contiguous.
  idx_t run(idx_t k) const { return tile ? tile - k % tile : std::numeric_limits<idx_t>::max(); }
};

inline Layout row_major(const float* p, idx_t ld) { return Layout{const_cast<float*>(p), ld}; }
inline Layout tiled(const float* p, idx_t tile, idx_t cols) {
  return Layout{const_cast<float*>(p), 0, tile, cols / tile};
}

// ---- micro-kernels: C[MR x NR] (=|+=) Ap[kc x MR]^T-packed @ Bp[kc x NR] ------------------
// Each kernel computes the first ROWS rows and COLS columns of an MR x NR block (the packed
// slivers always have MR and NR lanes); the narrower instances serve the edges of C.
#if defined(__AVX512F__)
template <int ROWS, int COLS>
inline void micro_kernel_t(idx_t kc, const float* __restrict__ A, const float* __restrict__ B,
                           float* C, idx_t ldc, bool accumulate) {
  constexpr int V = COLS / 16;
  __m512 c[ROWS][V];
#pragma GCC unroll 12
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) c[r][v] = _mm512_setzero_ps();
  for (idx_t k = 0; k < kc; ++k) {
    __m512 b[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) b[v] = _mm512_load_ps(B + 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < ROWS; ++r) {
      const __m512 a = _mm512_set1_ps(A[r]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) c[r][v] = _mm512_fmadd_ps(a, b[v], c[r][v]);
    }
    A += MR;
    B += NR;
  }
#pragma GCC unroll 12
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      float* cr = C + r * ldc + 16 * v;
      if (accumulate) c[r][v] = _mm512_add_ps(c[r][v], _mm512_loadu_ps(cr));
      _mm512_storeu_ps(cr, c[r][v]);
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
template <int ROWS, int COLS>
inline void micro_kernel_t(idx_t kc, const float* __restrict__ A, const float* __restrict__ B,
                           float* C, idx_t ldc, bool accumulate) {
  constexpr int V = COLS / 8;
  __m256 c[ROWS][V];
#pragma GCC unroll 6
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) c[r][v] = _mm256_setzero_ps();
  for (idx_t k = 0; k < kc; ++k) {
    __m256 b[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) b[v] = _mm256_load_ps(B + 8 * v);
#pragma GCC unroll 6
    for (int r = 0; r < ROWS; ++r) {
      const __m256 a = _mm256_broadcast_ss(A + r);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) c[r][v] = _mm256_fmadd_ps(a, b[v], c[r][v]);
    }
    A += MR;
    B += NR;
  }
#pragma GCC unroll 6
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) {
      float* cr = C + r * ldc + 8 * v;
      if (accumulate) c[r][v] = _mm256_add_ps(c[r][v], _mm256_loadu_ps(cr));
      _mm256_storeu_ps(cr, c[r][v]);
    }
}
#else
template <int ROWS, int COLS>
inline void micro_kernel_t(idx_t kc, const float* __restrict__ A, const float* __restrict__ B,
                           float* C, idx_t ldc, bool accumulate) {
  float c[ROWS][COLS] = {};
  for (idx_t k = 0; k < kc; ++k) {
    for (int r = 0; r < ROWS; ++r) {
      const float a = A[r];
      for (int j = 0; j < COLS; ++j) c[r][j] += a * B[j];
    }
    A += MR;
    B += NR;
  }
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < COLS; ++j) C[r * ldc + j] = accumulate ? C[r * ldc + j] + c[r][j] : c[r][j];
}
#endif

// The full-size kernel: C[MR x NR] (=|+=) the packed slivers' product.
inline void micro_kernel(idx_t kc, const float* A, const float* B, float* C, idx_t ldc,
                         bool accumulate) {
  micro_kernel_t<MR, NR>(kc, A, B, C, ldc, accumulate);
}

// An edge block (mr <= MR rows, nr <= NR columns) into buf (row stride NR), using the
// smallest kernel that covers it: a third or half of the rows, half of the columns.
inline void edge_kernel(idx_t kc, const float* A, const float* B, float* buf, idx_t mr, idx_t nr) {
  constexpr int R1 = MR / 3, R2 = 2 * MR / 3, C1 = NR / 2;
  if (nr <= C1) {
    if (mr <= R1) return micro_kernel_t<R1, C1>(kc, A, B, buf, NR, false);
    if (mr <= R2) return micro_kernel_t<R2, C1>(kc, A, B, buf, NR, false);
    return micro_kernel_t<MR, C1>(kc, A, B, buf, NR, false);
  }
  if (mr <= R1) return micro_kernel_t<R1, NR>(kc, A, B, buf, NR, false);
  if (mr <= R2) return micro_kernel_t<R2, NR>(kc, A, B, buf, NR, false);
  micro_kernel_t<MR, NR>(kc, A, B, buf, NR, false);
}

// ---- packing --------------------------------------------------------------------------------
// The tile size the packers specialise for (NDArray's __tile_size__); other tile sizes take
// the generic run-by-run path.
constexpr idx_t kFastTile = 8;

// dst[k*MR + r] = A(i0 + r, k0 + k) for r < mr (zero for mr <= r < MR), k < kc.
inline void pack_a(const Layout& A, idx_t i0, idx_t mr, idx_t k0, idx_t kc, float* dst) {
  const float* rows[MR];
  for (int r = 0; r < MR; ++r) rows[r] = r < mr ? A.addr(i0 + r, k0) : nullptr;
  if (mr == MR && (!A.tile || (A.tile == kFastTile && k0 % kFastTile == 0))) {
    // Row-major: each row is contiguous. Tiled: within a tile row segments are contiguous
    // and the next tile of the same rows is T*T elements further on.
    const idx_t seg = A.tile ? kFastTile : kc;
    const idx_t jump = A.tile ? kFastTile * kFastTile : 0;
    for (idx_t k = 0; k < kc; k += seg) {
      const idx_t n = std::min(seg, kc - k);
      for (idx_t t = 0; t < n; ++t)
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) dst[(k + t) * MR + r] = rows[r][t];
      for (int r = 0; r < MR; ++r) rows[r] += jump;
    }
    return;
  }
  for (idx_t r = 0; r < MR; ++r) {
    if (r >= mr) {
      for (idx_t k = 0; k < kc; ++k) dst[k * MR + r] = 0.0f;
      continue;
    }
    for (idx_t k = 0; k < kc;) {
      const idx_t n = std::min(kc - k, A.run(k0 + k));
      const float* src = A.addr(i0 + r, k0 + k);
      for (idx_t t = 0; t < n; ++t) dst[(k + t) * MR + r] = src[t];
      k += n;
    }
  }
}

// dst[k*NR + c] = B(k0 + k, j0 + c) for c < nr (zero for nr <= c < NR), k < kc.
inline void pack_b(const Layout& B, idx_t k0, idx_t kc, idx_t j0, idx_t nr, float* dst) {
  if (nr == NR && !B.tile) {
    const float* src = B.ptr + k0 * B.ld + j0;
    for (idx_t k = 0; k < kc; ++k) std::memcpy(dst + k * NR, src + k * B.ld, NR * sizeof(float));
    return;
  }
  if (nr == NR && B.tile == kFastTile && j0 % kFastTile == 0) {
    constexpr idx_t T = kFastTile;
    for (idx_t k = 0; k < kc; ++k) {
      const float* src = B.addr(k0 + k, j0);
      float* d = dst + k * NR;
#pragma GCC unroll 4
      for (idx_t c = 0; c < NR; c += T) std::memcpy(d + c, src + c * T, T * sizeof(float));
    }
    return;
  }
  for (idx_t k = 0; k < kc; ++k) {
    float* d = dst + k * NR;
    for (idx_t c = 0; c < nr;) {
      const idx_t n = std::min(nr - c, B.run(j0 + c));
      std::memcpy(d + c, B.addr(k0 + k, j0 + c), size_t(n) * sizeof(float));
      c += n;
    }
    for (idx_t c = nr; c < NR; ++c) d[c] = 0.0f;
  }
}

// C(i0 + r, j0 + c) (=|+=) buf[r*NR + c] for r < mr, c < nr.
inline void write_back(const float* buf, idx_t mr, idx_t nr, const Layout& C, idx_t i0, idx_t j0,
                       bool accumulate) {
  if (C.tile == kFastTile && nr == NR && j0 % kFastTile == 0) {
    constexpr idx_t T = kFastTile;
    for (idx_t r = 0; r < mr; ++r) {
      float* dst = C.addr(i0 + r, j0);
      const float* src = buf + r * NR;
      if (accumulate) {
#pragma GCC unroll 4
        for (idx_t c = 0; c < NR; c += T)
          for (idx_t t = 0; t < T; ++t) dst[c * T + t] += src[c + t];
      } else {
#pragma GCC unroll 4
        for (idx_t c = 0; c < NR; c += T)
          for (idx_t t = 0; t < T; ++t) dst[c * T + t] = src[c + t];
      }
    }
    return;
  }
  for (idx_t r = 0; r < mr; ++r)
    for (idx_t c = 0; c < nr;) {
      const idx_t n = std::min(nr - c, C.run(j0 + c));
      float* dst = C.addr(i0 + r, j0 + c);
      const float* src = buf + r * NR + c;
      if (accumulate)
        for (idx_t t = 0; t < n; ++t) dst[t] += src[t];
      else
        for (idx_t t = 0; t < n; ++t) dst[t] = src[t];
      c += n;
    }
}

// ---- buffers --------------------------------------------------------------------------------
struct AlignedBuffer {
  float* p = nullptr;
  size_t n = 0;
  float* get(size_t need) {
    if (need > n) {
      std::free(p);
      p = static_cast<float*>(std::aligned_alloc(64, ((need * sizeof(float) + 63) / 64) * 64));
      if (!p) {
        n = 0;
        throw std::bad_alloc();
      }
      n = need;
    }
    return p;
  }
  // Buffers above `keep` elements are not cached between calls.
  void trim(size_t keep) {
    if (n > keep) {
      std::free(p);
      p = nullptr;
      n = 0;
    }
  }
  ~AlignedBuffer() { std::free(p); }
};

// Packed-B buffers up to this many elements (16 MiB) stay allocated for the next product.
constexpr size_t kKeepPacked = size_t(1) << 22;

// ---- matrix-vector shapes: no packing, one pass over the matrix -----------------------------
// C (1, p) = a (1, n) @ B (n, p), B row-major; threads split the columns in chunks of 256.
inline void gemv_row(idx_t n, idx_t p, const float* a, const float* B, idx_t ldb, float* c) {
  auto cols = [=](idx_t j0, idx_t j1) {
    float* cj = c + j0;
    std::fill(cj, c + j1, 0.0f);
    for (idx_t k = 0; k < n; ++k) {
      const float ak = a[k];
      const float* b = B + k * ldb + j0;
      for (idx_t j = 0; j < j1 - j0; ++j) cj[j] += ak * b[j];
    }
  };
  constexpr idx_t grain = 256;
  if (double(n) * p < kParallelFlops / 2 || p <= grain || max_threads() <= 1) return cols(0, p);
  auto chunk = [&](int64_t t) { cols(t * grain, std::min(p, (t + 1) * grain)); };
  parallel_for((p + grain - 1) / grain, chunk);
}

// C (m, 1) = A (m, n) @ b (n, 1), A row-major. Sixteen partial sums per row keep it vectorised.
inline void gemv_col(idx_t m, idx_t n, const float* A, idx_t lda, const float* b, float* c) {
  auto rows = [=](idx_t i0, idx_t i1) {
    for (idx_t i = i0; i < i1; ++i) {
      const float* a = A + i * lda;
      float acc[16] = {0};
      idx_t k = 0;
      for (; k + 16 <= n; k += 16)
        for (int t = 0; t < 16; ++t) acc[t] += a[k + t] * b[k + t];
      float s = 0.0f;
      for (; k < n; ++k) s += a[k] * b[k];
      for (int t = 0; t < 16; ++t) s += acc[t];
      c[i] = s;
    }
  };
  constexpr idx_t grain = 64;
  if (double(m) * n < kParallelFlops / 2 || m <= grain || max_threads() <= 1) return rows(0, m);
  auto chunk = [&](int64_t t) { rows(t * grain, std::min(m, (t + 1) * grain)); };
  parallel_for((m + grain - 1) / grain, chunk);
}

// ---- the driver -----------------------------------------------------------------------------
// Work split. B is packed once, whole, in units of (KC rows, column group); C is computed in
// tasks of (MC rows, column group), each packing its own A block. Work items are numbered
// units first, then tasks, and threads claim them in that order; a task waits only for the
// B units it reads (a ready flag each), so nothing waits for a thread that is not working.
struct Plan {
  idx_t m, n, p;
  idx_t nsl, npc, nrb, ncg;  // B slivers, K panels, row blocks, column groups
  idx_t sl_begin(idx_t g) const { return nsl * g / ncg; }
  idx_t kc(idx_t pc) const { return std::min(KC, n - pc * KC); }
  idx_t units() const { return npc * ncg; }
  idx_t tasks() const { return nrb * ncg; }
  // Packed panel pc starts after pc full panels; sliver s of it is NR x kc.
  float* panel(float* Bp, idx_t pc, idx_t s) const { return Bp + (pc * KC * nsl + s * kc(pc)) * NR; }
};

inline void wait_ready(const std::atomic<int>& flag) {
  for (int spin = 0; !flag.load(std::memory_order_acquire); ++spin)
    if (spin > 64) std::this_thread::yield();
}

// Packs B unit u = (pc, column group g).
inline void gemm_pack_unit(const Plan& P, const Layout& B, float* Bp, idx_t u) {
  const idx_t pc = u / P.ncg, g = u % P.ncg, kc = P.kc(pc);
  for (idx_t s = P.sl_begin(g); s < P.sl_begin(g + 1); ++s)
    pack_b(B, pc * KC, kc, s * NR, std::min<idx_t>(NR, P.p - s * NR), P.panel(Bp, pc, s));
}

// Computes task t = (row block, column group g) of C, over every K panel.
inline void gemm_task(const Plan& P, const Layout& A, const Layout& C, float* Bp,
                      const std::atomic<int>* ready, idx_t t) {
  thread_local AlignedBuffer abuf;
  float* Ap = abuf.get(size_t(MC * KC));
  alignas(64) float tmp[MR * NR];
  const idx_t ic = (t / P.ncg) * MC, g = t % P.ncg;
  const idx_t mc = std::min(MC, P.m - ic), nsla = (mc + MR - 1) / MR;
  for (idx_t pc = 0; pc < P.npc; ++pc) {
    const idx_t kc = P.kc(pc);
    const bool acc = pc > 0;
    for (idx_t s = 0; s < nsla; ++s)
      pack_a(A, ic + s * MR, std::min<idx_t>(MR, mc - s * MR), pc * KC, kc, Ap + s * MR * kc);
    wait_ready(ready[pc * P.ncg + g]);
    for (idx_t jr = P.sl_begin(g); jr < P.sl_begin(g + 1); ++jr) {
      const float* b = P.panel(Bp, pc, jr);
      const idx_t j = jr * NR, nr = std::min<idx_t>(NR, P.p - j);
      for (idx_t ir = 0; ir < nsla; ++ir) {
        const idx_t i = ic + ir * MR, mr = std::min<idx_t>(MR, P.m - i);
        const float* a = Ap + ir * MR * kc;
        if (!C.tile && mr == MR && nr == NR) {
          micro_kernel(kc, a, b, C.ptr + i * C.ld + j, C.ld, acc);
        } else {
          edge_kernel(kc, a, b, tmp, mr, nr);
          write_back(tmp, mr, nr, C, i, j, acc);
        }
      }
    }
  }
}

// C = A @ B for A (m, n), B (n, p), C (m, p), each row-major or tiled; n > 0. C must not
// overlap A or B.
inline void gemm(idx_t m, idx_t n, idx_t p, const Layout& A, const Layout& B, const Layout& C) {
  if (m == 0 || p == 0) return;
  if (!A.tile && !B.tile && !C.tile) {
    if (m == 1) return gemv_row(n, p, A.ptr, B.ptr, B.ld, C.ptr);
    if (p == 1) {
      thread_local AlignedBuffer col;
      float* b = col.get(size_t(n + m));
      float* c = b + n;
      for (idx_t k = 0; k < n; ++k) b[k] = B.ptr[k * B.ld];
      gemv_col(m, n, A.ptr, A.ld, b, c);
      for (idx_t i = 0; i < m; ++i) C.ptr[i * C.ld] = c[i];
      col.trim(kKeepPacked);
      return;
    }
  }
  const int nt = double(m) * double(n) * double(p) >= kParallelFlops ? max_threads() : 1;
  Plan P{m, n, p, (p + NR - 1) / NR, (n + KC - 1) / KC, (m + MC - 1) / MC, 1};
  // About 8 tasks per thread, so that claiming them dynamically balances the threads: split
  // the columns into groups when there are fewer row blocks (each group repacks its A blocks).
  if (nt > 1) P.ncg = std::min(P.nsl, std::max<idx_t>(1, (8 * nt + P.nrb - 1) / P.nrb));
  thread_local AlignedBuffer bbuf;
  float* Bp = bbuf.get(size_t(P.npc * KC * P.nsl * NR));
  std::unique_ptr<std::atomic<int>[]> ready(new std::atomic<int>[size_t(P.units())]);
  for (idx_t u = 0; u < P.units(); ++u) ready[u].store(0, std::memory_order_relaxed);
  auto item = [&](int64_t i) {
    if (i < P.units()) {
      gemm_pack_unit(P, B, Bp, i);
      ready[i].store(1, std::memory_order_release);
    } else {
      gemm_task(P, A, C, Bp, ready.get(), i - P.units());
    }
  };
  if (nt > 1) {
    parallel_for(P.units() + P.tasks(), item);
  } else {
    for (idx_t i = 0; i < P.units() + P.tasks(); ++i) item(i);
  }
  bbuf.trim(kKeepPacked);
}

// The textbook triple loop (i, j, k), kept for comparison: C = A @ B, all row-major.
inline void gemm_naive(idx_t m, idx_t n, idx_t p, const float* A, const float* B, float* C) {
  for (idx_t i = 0; i < m; ++i)
    for (idx_t j = 0; j < p; ++j) {
      float s = 0.0f;
      for (idx_t k = 0; k < n; ++k) s += A[i * n + k] * B[k * p + j];
      C[i * p + j] = s;
    }
}

}  // namespace gemm
}  // namespace needle_cpu
