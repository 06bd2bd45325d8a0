// The CPU backend's threads: a small pool whose workers help the calling thread.
//
// Why not an OpenMP parallel region: its closing barrier waits for every thread of the team.
// On a machine shared with other processes a worker is often not scheduled for a whole time
// slice (several ms), so each parallel region costs that much even when the caller could
// have done the work alone; measured here, a 4M-element add took 8 ms on two OpenMP threads
// against 1 ms on one. In this pool the caller claims chunks of the job itself, idle workers
// claim the rest, and the caller waits only for chunks that a worker has actually started.
// A worker that wakes late finds nothing left and goes back to sleep.
//
// A job is handed over without a lock or an allocation: the caller writes the job's fields
// and then one 64-bit claim word (generation, next chunk), which spinning workers watch and
// claim chunks from by compare-exchange. A microsecond-scale job (a 72x73x74 product is two
// halves of ~2.5 us) is worth sharing only so: a spinning worker starts ~0.1 us after the
// caller publishes (measured with timestamps; the former mutex, shared_ptr and a spin that
// looked every 64 pause instructions took 0.3-1.9 us).
//
// The thread count follows OMP_NUM_THREADS, else the CPUs the process may use. After fork()
// the child has no workers (threads do not survive fork), so a pthread_atfork handler switches
// it to running every job on the calling thread.
#pragma once

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NEEDLE_SPIN_HINT() _mm_pause()
#elif defined(__aarch64__)
#define NEEDLE_SPIN_HINT() asm volatile("yield" ::: "memory")
#else
#define NEEDLE_SPIN_HINT() ((void)0)
#endif

namespace needle::cpu {

inline std::atomic<bool>& forked_child() {
  static std::atomic<bool> flag{false};
  return flag;
}

inline void mark_forked_child() { forked_child().store(true, std::memory_order_relaxed); }

// Registers the fork handler once (called when the module is imported).
inline void install_fork_handler() {
  static const bool installed = [] {
    pthread_atfork(nullptr, nullptr, mark_forked_child);
    return true;
  }();
  (void)installed;
}

// OMP_NUM_THREADS (its first value) when set to a positive number, else the CPUs this process
// may run on (its affinity mask, which taskset and containers narrow), else all of them.
inline int configured_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && n > 0) return int(std::min<long>(n, 1024));
  }
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    for (int i = 0; i < workers; ++i) std::thread(&ThreadPool::worker_loop, this).detach();
    workers_ = workers;
  }

  // The process-wide pool (created on first use and never destroyed: its detached workers
  // sleep until the process exits).
  static ThreadPool& instance() {
    static ThreadPool* pool = new ThreadPool(configured_threads() - 1);
    return *pool;
  }

  int threads() const { return workers_ + 1; }

  // Calls body(i) for every i in [0, n) and returns when all calls have finished. The caller
  // takes part; body must not throw. One job at a time is shared with the workers: a call
  // made while another runs (from another thread, or from inside a body) runs on its caller.
  template <class F>
  void run(int64_t n, F& body) {
    if (n <= 0) return;
    if (n == 1 || workers_ == 0 || n >= kMaxChunks ||
        forked_child().load(std::memory_order_relaxed) ||
        owned_.exchange(true, std::memory_order_acquire)) {
      for (int64_t i = 0; i < n; ++i) body(i);
      return;
    }
    // Publish: the fields first, then the claim word with the next generation, which is what
    // a spinning worker watches. Sleeping workers are woken only when there are any (the
    // seq_cst store and load pair with a worker's before it sleeps: one of the two sees the
    // other).
    invoke_.store([](void* ctx, int64_t i) { (*static_cast<F*>(ctx))(i); },
                  std::memory_order_relaxed);
    ctx_.store(&body, std::memory_order_relaxed);
    total_.store(uint64_t(n), std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = (claim_.load(std::memory_order_relaxed) >> 32) + 1;
    claim_.store(gen << 32, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      // A worker about to wait checks the claim word under mu_: after this empty critical
      // section it either has seen the new generation or waits and gets the notification.
      // Notified outside the lock, a woken worker does not block again on a mutex held by
      // the caller it may just have preempted.
      { std::lock_guard<std::mutex> lock(mu_); }
      cv_.notify_all();
    }
    // The caller claims by fetch_add (the job stays this generation until it closes it).
    int64_t mine = 0;
    for (uint64_t i; (i = claim_.fetch_add(1, std::memory_order_acq_rel) & kIndex) < uint64_t(n);
         ++mine)
      body(int64_t(i));
    // Wait for the chunks the workers claimed, then close the job: a worker that read its
    // fields but has not claimed yet finds the claim word changed and claims nothing.
    for (int spin = 0; mine + done_.load(std::memory_order_acquire) < n; ++spin)
      if (spin >= (1 << 14)) std::this_thread::yield();
    claim_.exchange((gen << 32) | kIndex, std::memory_order_acq_rel);
    owned_.store(false, std::memory_order_release);
  }

 private:
  // The claim word: generation << 32 | index of the next chunk (kIndex: closed).
  static constexpr uint64_t kIndex = 0xffffffffu;
  static constexpr int64_t kMaxChunks = int64_t(1) << 31;

  void worker_loop() {
    using clock = std::chrono::steady_clock;
    uint64_t seen = claim_.load(std::memory_order_acquire) >> 32;
    for (;;) {
      // Spin 200 us (jobs come in bursts) reading the claim word alone, then sleep until the
      // next job. One spin hint per look (~30 ns on the AMD EPYC this was measured on): the
      // former loop of 64 pauses between looks noticed a job ~1 us late (now ~0.1 us), and
      // without any hint a spinning worker would take execution slots from a hyper-threaded
      // sibling, which may be the caller doing the work.
      // Every 20 us the spin yields the core: on a loaded machine a woken worker can share
      // the core of the caller waiting for it, which would otherwise wait out the whole spin
      // (72x73x74 products took 210 us in 3 % of calls so).
      auto now = clock::now();
      const auto until = now + std::chrono::microseconds(200);
      auto yield_at = now + std::chrono::microseconds(20);
      uint64_t c = claim_.load(std::memory_order_acquire);
      for (unsigned k = 1; (c >> 32) == seen; ++k) {
        if (k % 256 == 0) {
          now = clock::now();
          if (now >= until) break;
          if (now >= yield_at) {
            std::this_thread::yield();
            yield_at = now + std::chrono::microseconds(20);
          }
        }
        NEEDLE_SPIN_HINT();
        c = claim_.load(std::memory_order_acquire);
      }
      if ((c >> 32) == seen) {
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lock, [&] {
          c = claim_.load(std::memory_order_seq_cst);
          return (c >> 32) != seen;
        });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = c >> 32;
      help(c);
    }
  }

  // Claims and runs chunks of the job whose claim word was read as c, until none is left or
  // the job changed. A claim is a compare-exchange of the whole word, so it succeeds only
  // while the job is the one whose fields were read (they are written before its generation
  // is published and rewritten only after the job is closed).
  void help(uint64_t c) {
    const auto invoke = invoke_.load(std::memory_order_relaxed);
    void* const ctx = ctx_.load(std::memory_order_relaxed);
    const uint64_t total = total_.load(std::memory_order_relaxed), gen = c >> 32;
    while ((c >> 32) == gen && (c & kIndex) < total) {
      if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        invoke(ctx, int64_t(c & kIndex));
        done_.fetch_add(1, std::memory_order_release);
        c = claim_.load(std::memory_order_acquire);
      }
    }
  }

  int workers_ = 0;
  // The current job, on one cache line: the claim word, the body and the chunk count.
  alignas(64) std::atomic<uint64_t> claim_{0};
  std::atomic<void (*)(void*, int64_t)> invoke_{nullptr};
  std::atomic<void*> ctx_{nullptr};
  std::atomic<uint64_t> total_{0};
  alignas(64) std::atomic<int64_t> done_{0};  // chunks the workers finished
  alignas(64) std::atomic<bool> owned_{false};  // a caller is running a job
  std::atomic<int> sleepers_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Threads the kernels may use: the pool's size, or 1 in a forked child.
inline int max_threads() {
  if (forked_child().load(std::memory_order_relaxed)) return 1;
  return ThreadPool::instance().threads();
}

// body(i) for i in [0, n) on the pool (see ThreadPool::run).
template <class F>
inline void parallel_for(int64_t n, F&& body) {
  ThreadPool::instance().run(n, body);
}

}  // namespace needle::cpu
