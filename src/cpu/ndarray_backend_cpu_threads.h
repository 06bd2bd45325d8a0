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
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NEEDLE_CPU_RELAX() _mm_pause()
#else
#define NEEDLE_CPU_RELAX() std::this_thread::yield()
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
  // takes part; body must not throw.
  template <class F>
  void run(int64_t n, F& body) {
    if (n <= 0) return;
    if (n == 1 || workers_ == 0 || forked_child().load(std::memory_order_relaxed)) {
      for (int64_t i = 0; i < n; ++i) body(i);
      return;
    }
    auto job = std::make_shared<Job>();
    job->invoke = [](void* ctx, int64_t i) { (*static_cast<F*>(ctx))(i); };
    job->ctx = &body;
    job->total = n;
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = job;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    job->work();
    for (int spin = 0; job->done.load(std::memory_order_acquire) < n; ++spin) {
      if (spin < 1024)
        NEEDLE_CPU_RELAX();
      else
        std::this_thread::yield();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (current_ == job) current_.reset();
  }

 private:
  struct Job {
    void (*invoke)(void*, int64_t) = nullptr;
    void* ctx = nullptr;
    int64_t total = 0;
    std::atomic<int64_t> next{0}, done{0};
    // Claims and runs chunks until none is left. The caller of run() waits for `done`, so
    // ctx stays valid while any claimed chunk runs.
    void work() {
      for (;;) {
        const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= total) return;
        invoke(ctx, i);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };

  void worker_loop() {
    uint64_t seen = generation_.load(std::memory_order_acquire);
    for (;;) {
      // Spin briefly (jobs often come in bursts), then sleep until the next job.
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
      while (generation_.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() < until)
        for (int k = 0; k < 64; ++k) NEEDLE_CPU_RELAX();
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
        seen = generation_.load(std::memory_order_relaxed);
        job = current_;
      }
      if (job) job->work();
    }
  }

  int workers_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::shared_ptr<Job> current_;  // guarded by mu_
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
