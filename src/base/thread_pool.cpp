#include "base/thread_pool.h"

#include <immintrin.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace xpert {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this] { worker(); });
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

void ThreadPool::worker() {
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
    run_unclaimed_slots();
  }
}

void ThreadPool::run_unclaimed_slots() {
  // A claim made after this job's reset of next_slot_ (release) sees its job_; a late claim that finds
  // the counter past the end (this job done, or an earlier one) runs nothing.
  for (int slot; (slot = next_slot_.fetch_add(1, std::memory_order_acq_rel)) < n_threads_;) {
    (*job_)(slot, n_threads_);
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
  next_slot_.store(1, std::memory_order_release);
  {
    // Taking the lock orders the generation bump with a worker that is about to sleep.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0) cv_.notify_all();
  fn(0, n_threads_);
  // Slots no worker has started yet run here. When another process holds one of the cores, a worker
  // may not be scheduled for a whole time slice; waiting for it made every op cost a slice or a
  // yield round trip (decode at ~50 instead of ~68 t/s, see docs/PERF.md). Now the caller just goes on.
  run_unclaimed_slots();
  // Slots a worker has started must finish: yield instead of spinning hard, in case it was descheduled.
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

namespace {

// CPUs this process may run on (a container's cpuset), or the online count.
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &set)) cpus.push_back(i);
  if (cpus.empty())
    for (int i = 0; i < (int)std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)); ++i) cpus.push_back(i);
  return cpus;
}

// A cgroup v2 CPU quota ("max 100000" or "1600000 100000" in cpu.max), rounded up; 0 when unlimited.
int cgroup_cpu_quota() {
  std::ifstream in("/sys/fs/cgroup/cpu.max");
  std::string quota;
  long period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  const long q = std::atol(quota.c_str());
  return q > 0 ? (int)((q + period - 1) / period) : 0;
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

}  // namespace

int ThreadPool::default_threads() {
  // Physical cores among the CPUs we may use (hyper-thread siblings share one core's units), capped by
  // a container's CPU quota: /proc/cpuinfo lists the whole host inside a container, which oversubscribed
  // a 16-CPU container with one spinning thread per host core.
  const std::vector<int> cpus = allowed_cpus();
  std::set<std::pair<std::string, std::string>> cores;
  for (int cpu : cpus) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    const std::string core = read_line(dir + "core_id");
    if (core.empty()) {
      cores.clear();
      break;
    }
    cores.insert({read_line(dir + "physical_package_id"), core});
  }
  int n = cores.empty() ? (int)cpus.size() : (int)cores.size();
  if (const int quota = cgroup_cpu_quota(); quota > 0) n = std::min(n, quota);
  return std::max(1, n);
}

}  // namespace xpert
