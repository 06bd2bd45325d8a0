// The CPU module's instruction-set dependent kernels, written once: the blocked matrix
// product and the contiguous reductions, over GCC vector extensions of VW floats.
//
// CMake compiles this file once per instruction set (NEEDLE_ISA_AVX512, NEEDLE_ISA_AVX2,
// NEEDLE_ISA_PORTABLE) with that set's compiler flags; each copy lives in an anonymous
// namespace and exports one getter of its IsaKernels table (see ndarray_backend_cpu_isa.h).
//
// The matrix product follows Goto/BLIS, with B packed whole up front:
//   pack B, for every K panel pc (KC rows): NR-wide slivers, [k][NR] each
//   for each task (a row block of at most MC rows of C, a group of B slivers):
//     for pc in n by KC:          pack A (row block x KC) into MR-tall slivers, [k][MR] each
//       for (jr, ir) slivers:     micro-kernel: an MR x NR block of C held in registers
// Operands are read straight from strided views (a transposed operand is a swapped pair of
// strides, a shared matrix a batch stride of 0); packing is the only copy. Products of at
// most kGemmDirectFlops multiply-adds skip packing and threads (a plain loop nest), and
// batches of small products run one product per thread.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "cpu/ndarray_backend_cpu_isa.h"

#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(NEEDLE_ISA_AVX512)
#define NEEDLE_ISA_CONFIG kGemmAvx512
#define NEEDLE_ISA_GETTER isa_kernels_avx512
#elif defined(NEEDLE_ISA_AVX2)
#define NEEDLE_ISA_CONFIG kGemmAvx2
#define NEEDLE_ISA_GETTER isa_kernels_avx2
#elif defined(NEEDLE_ISA_PORTABLE)
#define NEEDLE_ISA_CONFIG kGemmPortable
#define NEEDLE_ISA_GETTER isa_kernels_portable
#else
#error "compile with one of NEEDLE_ISA_AVX512, NEEDLE_ISA_AVX2, NEEDLE_ISA_PORTABLE"
#endif

namespace needle::cpu {
namespace {

using idx_t = int64_t;
constexpr GemmConfig CFG = NEEDLE_ISA_CONFIG;
constexpr int VW = CFG.VW, MR = CFG.MR, NR = CFG.NR;
constexpr idx_t KC = CFG.KC, MC = CFG.MC;
constexpr int NV = NR / VW;  // vectors per row of the register block
static_assert(NR % VW == 0 && MC % MR == 0 && MR % 3 == 0 && NV % 2 == 0,
              "blocking constants do not fit the micro-kernel");

typedef float vec __attribute__((vector_size(VW * sizeof(float))));
typedef int32_t ivec __attribute__((vector_size(VW * sizeof(float))));

inline vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, const vec& v) { std::memcpy(p, &v, sizeof v); }
// Every lane = x, as one broadcast: x - (+0.0) is exactly x for every x (-0.0 included), so
// the subtraction folds away (`vec{} + x` would not: -0.0 + 0.0 is +0.0).
inline vec splat(float x) { return x - vec{}; }

template <class F>
void run_parallel(const Runner& run, idx_t n, F& f) {
  run.parallel_for(n, [](void* ctx, int64_t i) { (*static_cast<F*>(ctx))(i); }, &f);
}

// A 64-byte aligned scratch buffer that grows on demand.
struct Scratch {
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
  void trim(size_t keep) {
    if (n > keep) {
      std::free(p);
      p = nullptr;
      n = 0;
    }
  }
  ~Scratch() { std::free(p); }
};
// B slivers of one column group: a KC-deep panel of them fills 1 MiB (half a 2 MiB L2).
constexpr idx_t kPanelSlivers = std::max<idx_t>(1, (idx_t(1) << 20) / (KC * NR * idx_t(sizeof(float))));
// Packed-B buffers up to this many elements (16 MiB) stay allocated for the next product.
constexpr size_t kKeepPacked = size_t(1) << 22;

// ---- micro-kernel: C[ROWS x COLV*VW] (=|+=) Ap[kc x MR] (packed) @ Bp[kc x NR] (packed) ------
template <int ROWS, int COLV>
inline void micro_kernel(idx_t kc, const float* __restrict__ A, const float* __restrict__ B,
                         float* C, idx_t ldc, bool accumulate) {
  vec c[ROWS][COLV];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < COLV; ++v) c[r][v] = vec{};
  // The block of C is read (or written) once at the end: fetch its lines meanwhile.
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    __builtin_prefetch(C + r * ldc, 1);
    __builtin_prefetch(C + r * ldc + COLV * VW - 1, 1);
  }
  for (idx_t k = 0; k < kc; ++k) {
    vec b[COLV];
#pragma GCC unroll 8
    for (int v = 0; v < COLV; ++v) b[v] = load(B + v * VW);
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const vec a = splat(A[r]);
#pragma GCC unroll 8
      for (int v = 0; v < COLV; ++v) c[r][v] += a * b[v];
    }
    A += MR;
    B += NR;
  }
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < COLV; ++v) {
      float* cr = C + r * ldc + v * VW;
      store(cr, accumulate ? c[r][v] + load(cr) : c[r][v]);
    }
}

// An edge block (mr <= MR rows, nr <= NR columns) into buf (row stride NR), with the smallest
// kernel that covers it: a third, two thirds or all of the rows; half or all of the columns.
inline void edge_kernel(idx_t kc, const float* A, const float* B, float* buf, idx_t mr, idx_t nr) {
  constexpr int R1 = MR / 3, R2 = 2 * MR / 3, C1 = NV / 2;
  if (nr <= C1 * VW) {
    if (mr <= R1) return micro_kernel<R1, C1>(kc, A, B, buf, NR, false);
    if (mr <= R2) return micro_kernel<R2, C1>(kc, A, B, buf, NR, false);
    return micro_kernel<MR, C1>(kc, A, B, buf, NR, false);
  }
  if (mr <= R1) return micro_kernel<R1, NV>(kc, A, B, buf, NR, false);
  if (mr <= R2) return micro_kernel<R2, NV>(kc, A, B, buf, NR, false);
  micro_kernel<MR, NV>(kc, A, B, buf, NR, false);
}

// ---- packing straight from strided operands -------------------------------------------------
// dst[k*MR + r] = A(i0 + r, k0 + k) for r < mr (zero for mr <= r < MR), k < kc.
inline void pack_a(const float* a, idx_t rs, idx_t cs, idx_t i0, idx_t mr, idx_t k0, idx_t kc,
                   float* __restrict__ dst) {
  const float* base = a + i0 * rs + k0 * cs;
  if (mr == MR && cs == 1) {  // rows contiguous along k
    const float* rows[MR];
    for (int r = 0; r < MR; ++r) rows[r] = base + r * rs;
    for (idx_t k = 0; k < kc; ++k)
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) dst[k * MR + r] = rows[r][k];
    return;
  }
  if (mr == MR && rs == 1) {  // a transposed operand: the MR rows are contiguous for each k
    for (idx_t k = 0; k < kc; ++k) std::memcpy(dst + k * MR, base + k * cs, MR * sizeof(float));
    return;
  }
  for (idx_t k = 0; k < kc; ++k) {
    for (idx_t r = 0; r < mr; ++r) dst[k * MR + r] = base[r * rs + k * cs];
    for (idx_t r = mr; r < MR; ++r) dst[k * MR + r] = 0.0f;
  }
}

// dst[k*NR + c] = B(k0 + k, j0 + c) for c < nr (zero for nr <= c < NR), k < kc.
inline void pack_b(const float* b, idx_t rs, idx_t cs, idx_t k0, idx_t kc, idx_t j0, idx_t nr,
                   float* __restrict__ dst) {
  const float* base = b + k0 * rs + j0 * cs;
  if (cs == 1) {
    for (idx_t k = 0; k < kc; ++k) {
      std::memcpy(dst + k * NR, base + k * rs, size_t(nr) * sizeof(float));
      for (idx_t c = nr; c < NR; ++c) dst[k * NR + c] = 0.0f;
    }
    return;
  }
  if (rs == 1) {  // a transposed operand: each column is contiguous along k
    for (idx_t c = 0; c < nr; ++c) {
      const float* src = base + c * cs;
      for (idx_t k = 0; k < kc; ++k) dst[k * NR + c] = src[k];
    }
  } else {
    for (idx_t k = 0; k < kc; ++k)
      for (idx_t c = 0; c < nr; ++c) dst[k * NR + c] = base[k * rs + c * cs];
  }
  if (nr < NR)
    for (idx_t k = 0; k < kc; ++k)
      for (idx_t c = nr; c < NR; ++c) dst[k * NR + c] = 0.0f;
}

// Sharing a mid-sized product is off until split_off_until (steady clock, ns) after a stall,
// for split_backoff ns (see kSplitStallNs).
std::atomic<int64_t> split_off_until{0}, split_backoff{int64_t(kSplitBackoffNs)};

int64_t steady_ns() {  // clock_gettime, not <chrono>: no inline library code in this file
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}

bool split_allowed() { return steady_ns() >= split_off_until.load(std::memory_order_relaxed); }

// A stall at time `now`: sharing goes off, twice as long as last time when the stall came
// within that long of the last pause's end (the machine is still busy), else for the base time.
void split_stalled(int64_t now) {
  const int64_t last = split_off_until.load(std::memory_order_relaxed);
  int64_t pause = split_backoff.load(std::memory_order_relaxed);
  pause = now - last < pause ? std::min(2 * pause, int64_t(kSplitBackoffMaxNs))
                             : int64_t(kSplitBackoffNs);
  split_backoff.store(pause, std::memory_order_relaxed);
  split_off_until.store(now + pause, std::memory_order_relaxed);
}

// Calls that a slow worker made slower than the caller alone would have been, net of those it
// made faster (0 .. kSlowLimit); at kSlowLimit sharing is paused (split_stalled). On a VM the
// second vCPU can run at a fraction of the first's speed for seconds at a time, which no stall
// shows: measured on the 2-core AMD EPYC VM, 72x73x74 took 15 us shared against 8.6 us on one
// thread for 1.6 s at a time, then 7.3 us shared.
constexpr int kSlowLimit = 8;
std::atomic<int> slow_calls{0};

// Runs f(i) for i < n on the pool (the caller takes part) and watches the workers: when the
// caller, done with its own items, then waits longer than kSplitStallNs plus an item's
// multiply-adds at kSplitSlowRate (a worker preempted while it held an item), sharing is paused
// (split_stalled); so it is when calls keep taking longer than the caller's own pace says it
// would have taken alone (items it ran, times all items: slow_calls). A call whose items the
// caller ran all (a worker that woke late) says nothing either way.
template <class F>
void run_shared(const Runner& run, idx_t n, double item_flops, F& f) {
  const pthread_t caller = pthread_self();
  const int64_t start = steady_ns();
  int64_t own_end = 0, mine = 0;  // written by the caller only
  auto item = [&](int64_t i) {
    f(i);
    if (pthread_equal(pthread_self(), caller)) {
      own_end = steady_ns();
      ++mine;
    }
  };
  run_parallel(run, n, item);
  const int64_t end = steady_ns();
  if (own_end && double(end - own_end) > kSplitStallNs + item_flops / kSplitSlowRate)
    return split_stalled(end);
  if (mine == 0 || mine >= n) return;
  const bool slower = double(end - start) * double(mine) > 1.1 * double(own_end - start) * double(n);
  int s = slow_calls.load(std::memory_order_relaxed);
  s = std::max(0, std::min(kSlowLimit, s + (slower ? 1 : -1)));
  if (s == kSlowLimit) {
    s = 0;
    split_stalled(end);
  }
  slow_calls.store(s, std::memory_order_relaxed);
}

// ---- the blocked driver for one product -----------------------------------------------------
// One thread: B is packed whole up front, in units of (KC rows, column group), then C is
// computed in tasks of (row block of at most MC rows, column group), each packing its A block.
// Shared among threads, two ways, chosen by B's size:
// - Own packing (B under kGemmOwnPackFloats): C is cut into one task per thread (more when the
//   column groups for L2 require), by rows when A has at least as many rows as B has columns,
//   else by columns, and each task packs everything it reads itself, B panel by panel and A
//   block by block. B is packed once per row split, but no packed buffer is written by one
//   thread and read by another: such a buffer moves between the two cores' caches on every
//   call, which in the 2-core AMD EPYC VM's slow phases made shared products slower than one
//   thread (512x128x1000: 1054 us with B shared, 676 us with packing per task, 1190 us on one
//   thread; 128x512x128 with A transposed: 172, 100 and 162 us).
// - Shared B (larger B): B is packed once, in units as above, claimed by the threads before
//   the tasks; a task waits only for the B units it reads (a ready flag each), so nothing waits
//   for a thread that has not started. Reading a large B once per row split costs more memory
//   traffic than the cache moves save (2048^3 on a faster EPYC part: 50 ms against 45 ms
//   with B shared; below 8 MiB the two ways were within noise there).
struct Plan {
  idx_t m, n, p;
  idx_t nsl, npc, nrb, ncg, nsa;  // B slivers, K panels, row blocks, column groups, A slivers
  idx_t sl_begin(idx_t g) const { return nsl * g / ncg; }
  idx_t sa_begin(idx_t r) const { return nsa * r / nrb; }  // row blocks: even runs of slivers
  idx_t kc(idx_t pc) const { return std::min(KC, n - pc * KC); }
  idx_t units() const { return npc * ncg; }
  idx_t tasks() const { return nrb * ncg; }
  float* panel(float* Bp, idx_t pc, idx_t s) const { return Bp + (pc * KC * nsl + s * kc(pc)) * NR; }
};

// Waits for a B unit another thread is packing; yields after a short spin, since on a busy
// machine that thread may be waiting for this very core. A wait longer than kSplitStallNs
// means that thread was preempted: sharing is paused (split_stalled).
inline void wait_ready(const std::atomic<int>& flag) {
  int64_t since = 0;
  for (int spin = 0; !flag.load(std::memory_order_acquire); ++spin) {
    if (spin > 64) {
      const int64_t now = steady_ns();
      if (!since) since = now;
      if (since > 0 && double(now - since) > kSplitStallNs) {
        split_stalled(now);
        since = -1;  // once per wait
      }
      sched_yield();
    } else {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
}

// Packs B's slivers [j0, j1) of K panel pc into dst, kc * NR floats each.
inline void pack_panel(const Plan& P, const float* b, idx_t rs, idx_t cs, idx_t pc, idx_t j0,
                       idx_t j1, float* dst) {
  const idx_t kc = P.kc(pc);
  for (idx_t s = j0; s < j1; ++s)
    pack_b(b, rs, cs, pc * KC, kc, s * NR, std::min<idx_t>(NR, P.p - s * NR),
           dst + (s - j0) * kc * NR);
}

// Unit u of B packed whole: K panel u / ncg, column group u % ncg.
inline void pack_unit(const Plan& P, const float* b, idx_t rs, idx_t cs, float* Bp, idx_t u) {
  const idx_t pc = u / P.ncg, j0 = P.sl_begin(u % P.ncg);
  pack_panel(P, b, rs, cs, pc, j0, P.sl_begin(u % P.ncg + 1), P.panel(Bp, pc, j0));
}

// C += (or =, for the first panel) the A slivers [s0, s0 + nsla) times the B slivers [j0, j1) of
// K panel pc; `panel` holds the packed B slivers from j0 on, kc * NR floats each. Packs the A
// slivers first (at most MC rows: they stay in L2 while the B slivers pass over them), then
// waits for `ready`, if given, before reading the panel.
inline void block_product(const Plan& P, const float* a, idx_t ars, idx_t acs, float* C,
                          idx_t pc, idx_t s0, idx_t nsla, idx_t j0, idx_t j1, const float* panel,
                          const std::atomic<int>* ready = nullptr) {
  const idx_t kc = P.kc(pc), ldc = P.p, ic = s0 * MR;
  const idx_t mc = std::min(P.m, (s0 + nsla) * MR) - ic;
  const bool acc = pc > 0;
  thread_local Scratch abuf;
  float* Ap = abuf.get(size_t(nsla * MR * kc));
  alignas(64) float tmp[MR * NR];
  for (idx_t s = 0; s < nsla; ++s)
    pack_a(a, ars, acs, ic + s * MR, std::min<idx_t>(MR, mc - s * MR), pc * KC, kc,
           Ap + s * MR * kc);
  if (ready) wait_ready(*ready);
  for (idx_t jr = j0; jr < j1; ++jr) {
    const float* bp = panel + (jr - j0) * kc * NR;
    const idx_t j = jr * NR, nr = std::min<idx_t>(NR, P.p - j);
    for (idx_t ir = 0; ir < nsla; ++ir) {
      const idx_t i = ic + ir * MR, mr = std::min<idx_t>(MR, P.m - i);
      const float* ap = Ap + ir * MR * kc;
      if (mr == MR && nr == NR) {
        micro_kernel<MR, NV>(kc, ap, bp, C + i * ldc + j, ldc, acc);
      } else {
        edge_kernel(kc, ap, bp, tmp, mr, nr);
        for (idx_t r = 0; r < mr; ++r) {
          float* dst = C + (i + r) * ldc + j;
          const float* src = tmp + r * NR;
          if (acc)
            for (idx_t c = 0; c < nr; ++c) dst[c] += src[c];
          else
            for (idx_t c = 0; c < nr; ++c) dst[c] = src[c];
        }
      }
    }
  }
}

// Task t: its row block by its column group, reading B packed whole in Bp (`ready`: the units'
// flags when other threads pack them).
inline void run_task(const Plan& P, const float* a, idx_t ars, idx_t acs, float* C, float* Bp,
                     const std::atomic<int>* ready, idx_t t) {
  const idx_t rb = t % P.nrb, g = t / P.nrb;  // consecutive tasks share B columns
  const idx_t s0 = P.sa_begin(rb), j0 = P.sl_begin(g);
  for (idx_t pc = 0; pc < P.npc; ++pc)
    block_product(P, a, ars, acs, C, pc, s0, P.sa_begin(rb + 1) - s0, j0, P.sl_begin(g + 1),
                  P.panel(Bp, pc, j0), ready ? ready + pc * P.ncg + g : nullptr);
}

// Task t of a shared plan: its rows by its column group, packing every operand it reads.
inline void run_own_task(const Plan& P, const float* a, idx_t ars, idx_t acs, const float* b,
                         idx_t brs, idx_t bcs, float* C, idx_t t) {
  const idx_t rb = t % P.nrb, g = t / P.nrb;
  const idx_t j0 = P.sl_begin(g), j1 = P.sl_begin(g + 1), s_end = P.sa_begin(rb + 1);
  thread_local Scratch own;
  float* Bp = own.get(size_t((j1 - j0) * KC * NR));
  for (idx_t pc = 0; pc < P.npc; ++pc) {
    pack_panel(P, b, brs, bcs, pc, j0, j1, Bp);
    for (idx_t s0 = P.sa_begin(rb); s0 < s_end; s0 += MC / MR)
      block_product(P, a, ars, acs, C, pc, s0, std::min<idx_t>(MC / MR, s_end - s0), j0, j1, Bp);
  }
  own.trim(kKeepPacked);
}

// C (m x p, compact) = A (m x n) @ B (n x p) with the packed engine, on up to `threads`.
void gemm_blocked(const float* a, idx_t ars, idx_t acs, const float* b, idx_t brs, idx_t bcs,
                  float* C, idx_t m, idx_t n, idx_t p, const Runner& run, bool threaded) {
  const int nt = threaded ? run.threads : 1;
  const idx_t nsa = (m + MR - 1) / MR;
  Plan P{m, n, p, (p + NR - 1) / NR, (n + KC - 1) / KC, (nsa + MC / MR - 1) / (MC / MR), 1, nsa};
  const bool own_packing = nt > 1 && double(n) * double(p) < kGemmOwnPackFloats;
  if (own_packing) {  // one task per thread, by rows or by columns (see above)
    P.nrb = m >= p ? std::min<idx_t>(nsa, nt) : 1;
    P.ncg = m >= p ? 1 : std::min<idx_t>(P.nsl, nt);
  } else if (nt > 1) {
    // Row blocks of at most MC rows, as many as a multiple of the thread count (each block
    // packs its A panel once and the threads get equal shares); only when there are fewer
    // slivers of A than threads are the columns split into groups too.
    P.nrb = std::min(nsa, (P.nrb + nt - 1) / nt * nt);
    if (P.nrb < nt) P.ncg = std::min<idx_t>(P.nsl, (nt + P.nrb - 1) / P.nrb);
  }
  // Column groups narrow enough that a task's K panel of B stays in L2 while its A slivers
  // pass over it (each sliver of B is read once per A sliver; from L3 that is the bottleneck).
  P.ncg = std::max(P.ncg, (P.nsl + kPanelSlivers - 1) / kPanelSlivers);
  const double task_flops = double(m) * double(n) * double(p) / double(P.tasks());
  if (own_packing) {
    auto item = [&](int64_t t) { run_own_task(P, a, ars, acs, b, brs, bcs, C, t); };
    run_shared(run, P.tasks(), task_flops, item);
    return;
  }
  thread_local Scratch bbuf;
  float* Bp = bbuf.get(size_t(P.npc * KC * P.nsl * NR));
  if (nt <= 1) {
    for (idx_t u = 0; u < P.units(); ++u) pack_unit(P, b, brs, bcs, Bp, u);
    for (idx_t t = 0; t < P.tasks(); ++t) run_task(P, a, ars, acs, C, Bp, nullptr, t);
  } else {
    std::unique_ptr<std::atomic<int>[]> ready(new std::atomic<int>[size_t(P.units())]);
    for (idx_t u = 0; u < P.units(); ++u) ready[u].store(0, std::memory_order_relaxed);
    auto item = [&](int64_t i) {
      if (i < P.units()) {
        pack_unit(P, b, brs, bcs, Bp, i);
        ready[i].store(1, std::memory_order_release);
      } else {
        run_task(P, a, ars, acs, C, Bp, ready.get(), i - P.units());
      }
    };
    run_shared(run, P.units() + P.tasks(), task_flops, item);
  }
  bbuf.trim(kKeepPacked);
}

// ---- small products: no packing, no threads -------------------------------------------------
void gemm_direct(const float* a, idx_t ars, idx_t acs, const float* b, idx_t brs, idx_t bcs,
                 float* __restrict__ C, idx_t m, idx_t n, idx_t p) {
  if (bcs == 1) {  // rows of C accumulate rows of B (vectorised along j)
    for (idx_t i = 0; i < m; ++i) {
      float* __restrict__ c = C + i * p;
      for (idx_t j = 0; j < p; ++j) c[j] = 0.0f;
      for (idx_t k = 0; k < n; ++k) {
        const float aik = a[i * ars + k * acs];
        const float* __restrict__ brow = b + k * brs;
        for (idx_t j = 0; j < p; ++j) c[j] += aik * brow[j];
      }
    }
    return;
  }
  if (acs == 1 && brs == 1) {  // dot products of contiguous rows of A and columns of B
    for (idx_t i = 0; i < m; ++i)
      for (idx_t j = 0; j < p; ++j) {
        const float* __restrict__ x = a + i * ars;
        const float* __restrict__ y = b + j * bcs;
        vec acc{};
        idx_t k = 0;
        for (; k + VW <= n; k += VW) acc += load(x + k) * load(y + k);
        float s = 0.0f;
        for (int t = 0; t < VW; ++t) s += acc[t];
        for (; k < n; ++k) s += x[k] * y[k];
        C[i * p + j] = s;
      }
    return;
  }
  for (idx_t i = 0; i < m; ++i)
    for (idx_t j = 0; j < p; ++j) {
      float s = 0.0f;
      for (idx_t k = 0; k < n; ++k) s += a[i * ars + k * acs] * b[k * brs + j * bcs];
      C[i * p + j] = s;
    }
}

// ---- one-thread products of rows-contiguous operands: the micro-kernel reads them in place --
// C[ROWS x COLV*VW] = A[rows x n] @ B[n x COLV*VW], A(r, k) = A[r * ars + k], B(k, c) =
// B[k * brs + c]. Rows at or past mr repeat row mr - 1 (their results are not used).
template <int ROWS, int COLV>
inline void unpacked_kernel(idx_t n, const float* A, idx_t ars, idx_t mr, const float* B,
                            idx_t brs, float* C, idx_t ldc) {
  const float* ar[ROWS];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) ar[r] = A + std::min<idx_t>(r, mr - 1) * ars;
  vec c[ROWS][COLV];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < COLV; ++v) c[r][v] = vec{};
  for (idx_t k = 0; k < n; ++k) {
    vec b[COLV];
#pragma GCC unroll 8
    for (int v = 0; v < COLV; ++v) b[v] = load(B + k * brs + v * VW);
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const vec a = splat(ar[r][k]);
#pragma GCC unroll 8
      for (int v = 0; v < COLV; ++v) c[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < COLV; ++v) store(C + r * ldc + v * VW, c[r][v]);
}

std::atomic<uint64_t> unpacked_calls{0};  // numbers each gemm_unpacked call (edge_copy)

// The narrow last sliver of B (columns last .. last + tail, n rows) zero-padded to NR columns,
// in this thread's own buffer, packed once per call (`call`). Each thread packs its own copy:
// one copy that the caller writes and a worker reads moves between their caches on every
// call, which in the 2-core AMD EPYC VM's slow phases cost more than sharing saved (72x73x74
// shared took 15 us, 5.4 us of it repacking the copy the worker had read, against 9.2 us on
// one thread; with a copy per thread 9.2 us then, and 6.6 against 6.5 us in quiet phases).
const float* edge_copy(uint64_t call, const float* b, idx_t brs, idx_t n, idx_t last, idx_t tail) {
  thread_local Scratch buf;
  thread_local uint64_t packed = 0;
  const size_t need = size_t(n) * NR;
  if (buf.n > kKeepPacked && buf.n > need) buf.trim(0);  // a large copy is kept one call only
  const bool grown = buf.n < need;
  float* e = buf.get(need);
  if (grown || packed != call) {
    pack_b(b, brs, 1, 0, n, last, tail, e);
    packed = call;
  }
  return e;
}

// C (m x p, row stride ldc) = A (m x n) @ B (n x p), rows of both contiguous, without packing
// (small and mid-sized products, where packing would cost a third of the time): the last,
// narrow sliver of B alone is copied, zero-padded to NR columns, by each thread for itself
// (edge_copy). Threaded, the work is cut into chunks of one sliver of B by a run of row
// blocks, which the threads claim in the one-thread order (slivers outer, the narrow one
// last): a worker that does not come costs nothing but the job's publication, and each
// element of C is the same chain of multiply-adds in k order whichever thread computes it.
void gemm_unpacked(const float* a, idx_t ars, const float* b, idx_t brs, float* C, idx_t ldc,
                   idx_t m, idx_t n, idx_t p, const Runner& run, bool threaded) {
  constexpr int R1 = MR / 3, R2 = 2 * MR / 3, C1 = NV / 2;
  const idx_t slivers = (p + NR - 1) / NR, blocks = (m + MR - 1) / MR;
  const idx_t last = (slivers - 1) * NR, tail = p - last;
  const uint64_t call = unpacked_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  // Row blocks [b0, b1) of C times sliver s of B.
  auto part = [&](idx_t s, idx_t b0, idx_t b1) {
    const idx_t j = s * NR, nr = std::min<idx_t>(NR, p - j);
    const float* edge = nr < NR ? edge_copy(call, b, brs, n, last, tail) : nullptr;
    const float* bs = nr < NR ? edge : b + j;
    const idx_t bstride = nr < NR ? NR : brs;
    alignas(64) float tmp[MR * NR];
    for (idx_t i = b0 * MR; i < std::min(m, b1 * MR); i += MR) {
      const idx_t mr = std::min<idx_t>(MR, m - i);
      const float* ai = a + i * ars;
      if (mr == MR && nr == NR) {
        unpacked_kernel<MR, NV>(n, ai, ars, mr, bs, bstride, C + i * ldc + j, ldc);
        continue;
      }
      if (nr <= C1 * VW) {
        if (mr <= R1) unpacked_kernel<R1, C1>(n, ai, ars, mr, bs, bstride, tmp, NR);
        else if (mr <= R2) unpacked_kernel<R2, C1>(n, ai, ars, mr, bs, bstride, tmp, NR);
        else unpacked_kernel<MR, C1>(n, ai, ars, mr, bs, bstride, tmp, NR);
      } else {
        if (mr <= R1) unpacked_kernel<R1, NV>(n, ai, ars, mr, bs, bstride, tmp, NR);
        else if (mr <= R2) unpacked_kernel<R2, NV>(n, ai, ars, mr, bs, bstride, tmp, NR);
        else unpacked_kernel<MR, NV>(n, ai, ars, mr, bs, bstride, tmp, NR);
      }
      for (idx_t r = 0; r < mr; ++r) std::memcpy(C + (i + r) * ldc + j, tmp + r * NR, nr * sizeof(float));
    }
  };
  if (!threaded || run.threads <= 1) {
    for (idx_t s = 0; s < slivers; ++s) part(s, 0, blocks);
  } else {
    // kSplitChunks chunks per thread (a whole sliver each when there are that many), of at
    // least kSplitChunkFlops multiply-adds each.
    const double flops = double(m) * double(n) * double(p);
    const idx_t want = idx_t(kSplitChunks) * run.threads;
    const idx_t fit = std::max<idx_t>(1, idx_t(flops / (kSplitChunkFlops * double(slivers))));
    const idx_t groups = std::min({blocks, (want + slivers - 1) / slivers, fit});
    auto chunk = [&](int64_t t) {
      const idx_t g = t % groups;
      part(t / groups, blocks * g / groups, blocks * (g + 1) / groups);
    };
    run_shared(run, slivers * groups, flops / double(slivers * groups), chunk);
  }
}

// C (1 x p) = a (1 x n) @ B (n x p), B rows contiguous; threads split the columns.
void gemv_row(const float* a, idx_t acs, const float* b, idx_t brs, float* C, idx_t n, idx_t p,
              const Runner& run, bool threaded) {
  auto cols = [=](idx_t j0, idx_t j1) {
    float* __restrict__ c = C + j0;
    for (idx_t j = 0; j < j1 - j0; ++j) c[j] = 0.0f;
    for (idx_t k = 0; k < n; ++k) {
      const float ak = a[k * acs];
      const float* __restrict__ brow = b + k * brs + j0;
      for (idx_t j = 0; j < j1 - j0; ++j) c[j] += ak * brow[j];
    }
  };
  constexpr idx_t grain = 256;
  if (!threaded || p <= grain || run.threads <= 1) return cols(0, p);
  auto chunk = [&](int64_t t) { cols(t * grain, std::min(p, (t + 1) * grain)); };
  run_parallel(run, (p + grain - 1) / grain, chunk);
}

// C (m x 1) = A (m x n) @ b (n x 1), A rows contiguous, b gathered into `col` first.
void gemv_col(const float* a, idx_t ars, const float* b, idx_t brs, float* C, idx_t m, idx_t n,
              const Runner& run, bool threaded) {
  thread_local Scratch colbuf;
  float* col = colbuf.get(size_t(n));
  for (idx_t k = 0; k < n; ++k) col[k] = b[k * brs];
  auto rows = [=](idx_t i0, idx_t i1) {
    for (idx_t i = i0; i < i1; ++i) {
      const float* x = a + i * ars;
      vec acc0{}, acc1{};
      idx_t k = 0;
      for (; k + 2 * VW <= n; k += 2 * VW) {
        acc0 += load(x + k) * load(col + k);
        acc1 += load(x + k + VW) * load(col + k + VW);
      }
      acc0 += acc1;
      float s = 0.0f;
      for (int t = 0; t < VW; ++t) s += acc0[t];
      for (; k < n; ++k) s += x[k] * col[k];
      C[i] = s;
    }
  };
  constexpr idx_t grain = 64;
  if (!threaded || m <= grain || run.threads <= 1) {
    rows(0, m);
  } else {
    auto chunk = [&](int64_t t) { rows(t * grain, std::min(m, (t + 1) * grain)); };
    run_parallel(run, (m + grain - 1) / grain, chunk);
  }
  colbuf.trim(kKeepPacked);
}

// One product, choosing its path.
void gemm_one(const float* a, idx_t ars, idx_t acs, const float* b, idx_t brs, idx_t bcs,
              float* C, idx_t m, idx_t n, idx_t p, const Runner& run, bool may_thread) {
  const double flops = double(m) * double(n) * double(p);
  if (flops <= kGemmDirectFlops) return gemm_direct(a, ars, acs, b, brs, bcs, C, m, n, p);
  const bool threaded = may_thread && run.threads > 1 && flops >= kGemmParallelFlops;
  if (m == 1 && bcs == 1) return gemv_row(a, acs, b, brs, C, n, p, run, threaded);
  if (p == 1 && acs == 1) return gemv_col(a, ars, b, brs, C, m, n, run, threaded);
  // Small and mid-sized products of rows-contiguous operands: no packing (shared among the
  // threads in chunks from kGemmSplitFlops on while sharing is not paused).
  const bool mid = may_thread && flops >= kGemmSplitFlops && flops < kGemmParallelFlops &&
                   split_allowed();
  if (acs == 1 && bcs == 1 && flops < kGemmParallelFlops)
    return gemm_unpacked(a, ars, b, brs, C, p, m, n, p, run, mid);
  // Strided operands: the packed engine, shared from kGemmSplitFlops on as the unpacked split
  // is (packing each task's A block costs little beside its share of the product).
  gemm_blocked(a, ars, acs, b, brs, bcs, C, m, n, p, run, threaded || (mid && run.threads > 1));
}

void gemm(const MatView& A, const MatView& B, float* out, int64_t batch, int64_t m, int64_t n,
          int64_t p, const Runner& run) {
  if (batch <= 0 || m <= 0 || p <= 0) return;
  const double flops = double(m) * double(n) * double(p);
  auto one = [&](int64_t k, bool may_thread) {
    gemm_one(A.at(k), A.rs, A.cs, B.at(k), B.rs, B.cs, out + k * m * p, m, n,
             p, run, may_thread);
  };
  // A batch of products too small to share one product among threads: a product per thread
  // (each is the same chain of multiply-adds whichever thread computes it), from
  // kGemmSplitFlops in all while sharing is not paused, and always from kGemmParallelFlops.
  const double total = flops * double(batch);
  if (batch > 1 && run.threads > 1 && flops < kGemmParallelFlops &&
      (total >= kGemmParallelFlops || (total >= kGemmSplitFlops && split_allowed()))) {
    auto item = [&](int64_t k) { one(k, false); };
    run_shared(run, batch, flops, item);
    return;
  }
  for (int64_t k = 0; k < batch; ++k) one(k, true);
}

// ---- contiguous reductions ------------------------------------------------------------------
// Sum of x[0:n]: four vector accumulators per block of 4096 elements, blocks added in double
// (as accurate as numpy's pairwise summation, and vectorised).
double sum_contig(const float* x, int64_t n) {
  constexpr idx_t block = 4096;
  double total = 0.0;
  for (idx_t b = 0; b < n; b += block) {
    const idx_t e = std::min<idx_t>(n, b + block);
    vec acc[4] = {};
    idx_t i = b;
    for (; i + 4 * VW <= e; i += 4 * VW)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[u] += load(x + i + u * VW);
    const vec s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    float part = 0.0f;
    for (int t = 0; t < VW; ++t) part += s[t];
    for (; i < e; ++i) part += x[i];
    total += part;
  }
  return total;
}

// Maximum of x[0:n] (n >= 1), NaN if any element is NaN: four independent accumulators (the
// compare-select chain would otherwise wait on itself), NaNs flagged on the side.
float max_contig(const float* x, int64_t n) {
  idx_t i = 0;
  float m = x[0];
  bool nan = false;
  if (n >= 4 * VW) {
    vec acc[4];
    ivec bad[4];
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      acc[u] = load(x + u * VW);
      bad[u] = acc[u] != acc[u];
    }
    for (i = 4 * VW; i + 4 * VW <= n; i += 4 * VW)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const vec v = load(x + i + u * VW);
        acc[u] = v > acc[u] ? v : acc[u];
        bad[u] |= v != v;
      }
    for (int u = 1; u < 4; ++u) {
      acc[0] = acc[u] > acc[0] ? acc[u] : acc[0];
      bad[0] |= bad[u];
    }
    for (int t = 0; t < VW; ++t) {
      m = acc[0][t] > m ? acc[0][t] : m;
      nan = nan || bad[0][t];
    }
  }
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan = nan || x[i] != x[i];
  }
  return nan ? __builtin_nanf("") : m;
}

bool sharing_allowed() { return split_allowed(); }
void sharing_stalled() { split_stalled(steady_ns()); }

const IsaKernels kKernels{CFG, &gemm, &sum_contig, &max_contig, &sharing_allowed, &sharing_stalled};

}  // namespace

const IsaKernels* NEEDLE_ISA_GETTER() { return &kKernels; }

#if defined(NEEDLE_ISA_PORTABLE) && !defined(NEEDLE_HAVE_X86_VARIANTS)
// Only the portable variant is built on this architecture.
const IsaKernels* isa_kernels_avx512() { return nullptr; }
const IsaKernels* isa_kernels_avx2() { return nullptr; }
#endif

}  // namespace needle::cpu
