#include "base/thread_pool.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>

namespace xpert {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int ith) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    // Spin a little (back-to-back ops at decode come within microseconds), then yield the core
    // (another process or our own main thread may need it), then sleep.
    for (int spin = 0; gen == seen && spin < 20000; ++spin) {
      _mm_pause();
      if ((spin & 255) == 255) std::this_thread::yield();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      sleepers_.fetch_sub(1);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    (*job_)(ith, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Taking the lock orders the generation bump with a worker that is about to sleep.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0) cv_.notify_all();
  fn(0, n_threads_);
  // A worker the OS descheduled must get a core to finish: yield instead of spinning hard.
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < 2000) _mm_pause();
    else std::this_thread::yield();
  }
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  if (units == 1 || n_threads_ == 1) {
    fn(0, n);
    return;
  }
  run([&](int ith, int nth) {
    const int64_t per = (units + nth - 1) / nth;
    const int64_t b = std::min(n, ith * per * grain);
    const int64_t e = std::min(n, (ith + 1) * per * grain);
    if (b < e) fn(b, e);
  });
}

int ThreadPool::default_threads() {
  // Count distinct (physical id, core id) pairs; fall back to the logical count.
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<std::string, std::string>> cores;
  std::string line, phys = "0";
  while (std::getline(in, line)) {
    auto val = [&] { return line.substr(line.find(':') + 1); };
    if (line.rfind("physical id", 0) == 0) phys = val();
    if (line.rfind("core id", 0) == 0) cores.insert({phys, val()});
  }
  const int logical = (int)std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  if (cores.empty()) return logical;
  return std::min(logical, (int)cores.size());
}

}  // namespace xpert
