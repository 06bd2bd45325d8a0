// The CPU module's instruction-set variants: the named blocking constants of each, and the
// table of kernels every variant provides.
//
// src/cpu/ndarray_backend_cpu_kernels.cc holds the kernels once, written with GCC vector
// extensions over a vector of VW floats; CMake compiles it once per instruction set with that
// set's flags (AVX-512, AVX2+FMA, and a portable build with none), each copy in its own
// namespace. At import the module picks the best variant the CPU supports (cpuid), or the one
// named by NEEDLE_CPU_ISA=avx512|avx2|portable, and calls the kernels through this table.
// The kernel sources include no header with inline code shared with other translation units
// (the thread pool is reached through Runner), so no copy of a function compiled for a wider
// instruction set can be picked by the linker for a narrower one.
#pragma once

#include <cstdint>

namespace needle::cpu {

// Blocking of the matrix-product engine per instruction set:
//   VW  floats per vector register;
//   MR x NR the register block of C the micro-kernel holds (NR = a few vectors);
//   KC  depth of a packed panel (an NR-wide B sliver of KC rows stays in L1);
//   MC  rows of A packed per block (MC x KC stays in L2).
struct GemmConfig {
  const char* isa;
  int VW, MR, NR;
  int64_t KC, MC;
};
constexpr GemmConfig kGemmAvx512{"avx512", 16, 12, 32, 256, 96};
constexpr GemmConfig kGemmAvx2{"avx2", 8, 6, 16, 256, 72};
constexpr GemmConfig kGemmPortable{"portable", 4, 6, 8, 256, 72};
// The tile size T of matmul_tiled's (rows/T, cols/T, T, T) layout (__tile_size__).
constexpr int64_t kTile = 8;
// m*n*p at or below which a product takes the direct path (no packing, no threads): measured
// with one thread on AVX-512, the packed engine wins from about 24^3 on.
constexpr double kGemmDirectFlops = 20.0 * 20 * 20;
// From kGemmSplitFlops (about 51^3) up to kGemmParallelFlops (about 290^3) a product of
// rows-contiguous operands is shared among the threads without packing (the micro-kernel reads
// A and B in place), in chunks of a sliver of B by a run of row blocks that the threads claim
// in the one-thread order: a worker that is not running costs only the job's publication.
// Measured on a 2-core AMD EPYC VM (AVX-512), the kernel alone, median of calls where the
// pool's worker took part against calls it did not:
// 48^3 1.60 against 1.70 us, 64^3 2.0 against 2.8 us, 72x73x74 3.0-3.7 against 4.4-5.3 us,
// 128^3 11 against 20 us (the worker is often busy with other processes on a shared machine,
// and then the caller does it all). Below 2^17 a chunk is too short to share.
constexpr double kGemmSplitFlops = double(1 << 17);
// Chunks per thread of such a product, and the fewest multiply-adds in a chunk.
constexpr int kSplitChunks = 4;
constexpr double kSplitChunkFlops = double(1 << 15);
// A worker preempted while it holds a chunk (its time slice ends while another process wants
// its core) makes the caller wait until it runs again, a millisecond or more: on a machine
// whose other cores are busy, sharing then costs more than it saves. When the caller, done
// with its own chunks, waits longer than kSplitStallNs plus a chunk's multiply-adds at
// kSplitSlowRate per ns (a quarter of one thread's speed), sharing is off for kSplitBackoffNs,
// then tried again; a stall soon after doubles the pause, up to kSplitBackoffMaxNs. The wait
// that counts is a millisecond: shorter waits (wake-ups, interrupts) happen on a quiet
// machine too, and a 20 us threshold kept sharing off most of the time there (72x73x74,
// kernel every 3 us, mean per call, load 0.9: one thread 4.8 us, shared 3.5 us, shared with
// the 20 us threshold 4.7-6.6 us, with 1 ms 3.6-3.7 us; 128^3: 18.9, 11.2-12.4, 17.4-18.4,
// 12.2-13.0 us).
constexpr double kSplitStallNs = 1e6;
constexpr double kSplitSlowRate = 20.0;
constexpr double kSplitBackoffNs = 50e6;
constexpr double kSplitBackoffMaxNs = 2e9;
// From kGemmParallelFlops on the packed engine shares one product among every thread (packing
// B once or each its own share); below it the unpacked split ran 1.2-1.4x the packed engine at 256^3 on two
// threads. Products with a transposed (or otherwise strided) operand take the packed engine
// at every size above the direct path, shared from kGemmSplitFlops while sharing is not
// paused (a linear layer's gradients, 128x512x128 with A transposed: 161 us on one thread,
// 104 us shared); so do batches of products below kGemmSplitFlops each, a product per thread
// (64 heads of 32^3: 41 against 23 us). The same watch pauses all three: a stall, or calls
// that a slow worker made slower than the caller alone (run_shared in the kernels' source).
constexpr double kGemmParallelFlops = 24.0 * (1 << 20);
// B's size in floats (8 MiB) from which the shared packed engine packs B once for every thread;
// below it each thread packs what it reads itself (gemm_blocked in the kernels' source).
constexpr double kGemmOwnPackFloats = double(1 << 21);

// Runs fn(ctx, i) for i in [0, n) on the module's thread pool (the caller takes part).
struct Runner {
  void (*parallel_for)(int64_t n, void (*fn)(void*, int64_t), void* ctx);
  int threads;
};

// A matrix operand: element (i, k) of matrix b of the batch at
// ptr[(b / inner) * sb + (b % inner) * si + i * rs + k * cs] (strides in elements; any sign, 0
// allowed): a batch of two levels, `inner` matrices per outer step (per-head attention reads
// (batch, head) this way); the defaults make it one level, ptr[b * sb + ...].
struct MatView {
  const float* ptr;
  int64_t sb, rs, cs;
  int64_t inner = 1, si = 0;
  const float* at(int64_t b) const { return ptr + (b / inner) * sb + (b % inner) * si; }
};

struct IsaKernels {
  GemmConfig config;
  // out[b] (compact m x p, b < batch) = A[b] (m x n) @ B[b] (n x p); n > 0; out must not
  // overlap A or B.
  void (*gemm)(const MatView& A, const MatView& B, float* out, int64_t batch, int64_t m,
               int64_t n, int64_t p, const Runner& run);
  // Sum (accumulated in double) and NaN-propagating maximum of x[0:n], n >= 1 for max.
  double (*sum_contig)(const float* x, int64_t n);
  float (*max_contig)(const float* x, int64_t n);
  // Whether sharing mid-sized work among the threads is on (it pauses after a worker stalled
  // or kept a call waiting: kSplitStallNs), and the report of such a stall by other kernels.
  bool (*sharing_allowed)();
  void (*sharing_stalled)();
};

// The variants compiled into this build (nullptr when not compiled for this architecture).
const IsaKernels* isa_kernels_avx512();
const IsaKernels* isa_kernels_avx2();
const IsaKernels* isa_kernels_portable();

}  // namespace needle::cpu
