// One background thread that runs one job at a time. submit() hands it a job (waiting first for the one
// before to finish); wait() returns once the thread is idle. For work that overlaps the caller's own: the
// split MoE's host experts run here while the launching thread queues the GPU's next kernels, and a
// CUDA host function that calls wait() orders the stream after the job.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace xpert {

class BackgroundJob {
 public:
  BackgroundJob();
  ~BackgroundJob();  // waits for the current job
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;

  void submit(std::function<void()> job);
  void wait();
  // The exception the last failed job threw (null when none), cleared.
  std::exception_ptr take_error();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace xpert
