// A fork-join pool for the compute loops: run(fn) calls fn(slot, n_slots) once for each of n_threads
// slots and returns when all are done. The caller runs slot 0, then any slot no worker has claimed yet:
// slots must not wait for each other, and a slot's index is not a thread's identity. Workers spin
// briefly, then sleep, so back-to-back ops at decode pay no wake-up latency.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace xpert {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  void run(const std::function<void(int ith, int nth)>& fn);

  // Splits [0, n) into contiguous chunks, one per thread, each a multiple of `grain` (except the last).
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn, int64_t grain = 1);

  static int default_threads();  // physical cores, best effort

 private:
  void worker();
  void run_unclaimed_slots();  // claims and runs job_'s slots until none is left

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};    // slots 1..n-1 not finished yet
  std::atomic<int> next_slot_{0};  // the next slot to claim: a slot runs on whichever thread claims it
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<int> sleepers_{0};
};

}  // namespace xpert
