// Buffers of the CPU backend: 64-byte aligned float32 arrays, with a small cache of large ones.
//
// Why a cache: glibc serves a large aligned allocation with a fresh mmap and returns it with
// munmap when freed, so each new NDArray of a few MB page-faults all of its memory on first
// touch (measured here: 1-2 ms per 4 MB array, more than copying it). NDArray operations
// allocate and drop such arrays constantly (every op's result is a new one).
//
// Policy: buffers of at least kCacheMinBytes (64 KiB) and at most kCacheMaxBytes / 4 (64 MiB)
// are kept when freed, up to kCacheMaxBytes (256 MiB) in all, and handed to the next
// allocation of exactly the same rounded size (from kCacheGranuleFrom, 1 MiB, sizes are
// rounded up to 64 KiB; below it to 64 bytes, as every buffer). The buffers from 64 KiB to
// 1 MiB are kept too because glibc serves them from the top of its heap and trims the heap
// when they are freed: a Transformer LM step page-faulted about 850 times (3.4 MB of fresh
// pages) on its attention and activation arrays, every step. When keeping one more
// would pass the cap, the oldest kept buffers are freed first. Smaller and larger buffers go
// straight back to malloc. A forked child neither keeps nor reuses buffers. The module's
// cache_info() reports the cache (bytes, buffers, cap) and cache_clear() frees it;
// memory_stats() reports the bytes held by live Arrays and their peak since reset_peak().
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/ndarray_backend_cpu_threads.h"

namespace needle::cpu {

constexpr size_t ALIGNMENT = 64;
constexpr size_t kCacheMinBytes = size_t(64) << 10;
constexpr size_t kCacheGranuleFrom = size_t(1) << 20;
constexpr size_t kCacheMaxBytes = size_t(256) << 20;
constexpr size_t kCacheGranule = size_t(64) << 10;  // large sizes are rounded up to this

// Bytes held by live AlignedArrays (cached buffers excluded), and the peak of that figure.
inline std::atomic<int64_t>& live_bytes() {
  static std::atomic<int64_t> n{0};
  return n;
}
inline std::atomic<int64_t>& peak_bytes() {
  static std::atomic<int64_t> n{0};
  return n;
}
inline void count_alloc(int64_t bytes) {
  const int64_t now = live_bytes().fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_bytes().load(std::memory_order_relaxed);
  while (now > peak && !peak_bytes().compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

class BufferCache {
 public:
  struct Stats {
    size_t bytes, buffers;
  };
  Stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {cached_, free_.size()};
  }
  // Frees every kept buffer.
  void clear() {
    std::vector<Entry> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all.swap(free_);
      cached_ = 0;
    }
    for (const Entry& e : all) std::free(e.ptr);
  }

  static BufferCache& instance() {
    static BufferCache* cache = new BufferCache();  // never destroyed: used until exit
    return *cache;
  }

  // A buffer of exactly `bytes` (a rounded size) from the cache, or nullptr.
  void* take(size_t bytes) {
    if (forked_child().load(std::memory_order_relaxed)) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = free_.size(); i-- > 0;)
      if (free_[i].bytes == bytes) {
        void* p = free_[i].ptr;
        cached_ -= bytes;
        free_.erase(free_.begin() + long(i));
        return p;
      }
    return nullptr;
  }

  // Keeps p for reuse (evicting the oldest entries to stay within the limit), or frees it.
  void give(void* p, size_t bytes) {
    if (bytes < kCacheMinBytes || bytes > kCacheMaxBytes / 4 ||
        forked_child().load(std::memory_order_relaxed)) {
      std::free(p);
      return;
    }
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!free_.empty() && cached_ + bytes > kCacheMaxBytes) {
        evicted.push_back(free_.front().ptr);
        cached_ -= free_.front().bytes;
        free_.erase(free_.begin());
      }
      free_.push_back({p, bytes});
      cached_ += bytes;
    }
    for (void* q : evicted) std::free(q);
  }

 private:
  struct Entry {
    void* ptr;
    size_t bytes;
  };
  std::mutex mu_;
  std::vector<Entry> free_;  // oldest first
  size_t cached_ = 0;
};

// A flat, 64-byte aligned float32 buffer (uninitialised). Large buffers are advised to use
// transparent huge pages, as numpy does, and are recycled through BufferCache.
struct AlignedArray {
  float* ptr = nullptr;
  int64_t size = 0;
  size_t bytes = 0;

  explicit AlignedArray(int64_t n) {
    if (n < 0) throw std::invalid_argument("Array size must be non-negative, got " + std::to_string(n));
    if (n > (int64_t(1) << 60) / int64_t(sizeof(float)))
      throw std::invalid_argument("Array size " + std::to_string(n) + " is too large");
    bytes = std::max<size_t>(size_t(n) * sizeof(float), ALIGNMENT);
    const size_t granule = bytes >= kCacheGranuleFrom ? kCacheGranule : ALIGNMENT;
    bytes = (bytes + granule - 1) / granule * granule;
    if (bytes >= kCacheMinBytes) ptr = static_cast<float*>(BufferCache::instance().take(bytes));
    if (!ptr) {
      ptr = static_cast<float*>(std::aligned_alloc(ALIGNMENT, bytes));
      if (!ptr) throw std::bad_alloc();
      advise_huge_pages();
    }
    size = n;
    count_alloc(int64_t(bytes));
  }
  ~AlignedArray() {
    live_bytes().fetch_sub(int64_t(bytes), std::memory_order_relaxed);
    if (bytes >= kCacheMinBytes)
      BufferCache::instance().give(ptr, bytes);
    else
      std::free(ptr);
  }
  AlignedArray(const AlignedArray&) = delete;
  AlignedArray& operator=(const AlignedArray&) = delete;
  uintptr_t ptr_as_int() const { return reinterpret_cast<uintptr_t>(ptr); }

 private:
  void advise_huge_pages() {
#ifdef MADV_HUGEPAGE
    constexpr size_t page = 4096, huge_from = size_t(1) << 22;
    if (bytes >= huge_from) {
      const uintptr_t start = (reinterpret_cast<uintptr_t>(ptr) + page - 1) / page * page;
      const uintptr_t end = (reinterpret_cast<uintptr_t>(ptr) + bytes) / page * page;
      if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
    }
#endif
  }
};

}  // namespace needle::cpu
