#include "base/background_job.h"

#include <utility>

namespace xpert {

BackgroundJob::BackgroundJob() : thread_([this] { loop(); }) {}

BackgroundJob::~BackgroundJob() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BackgroundJob::submit(std::function<void()> job) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !busy_; });
    job_ = std::move(job);
    busy_ = true;
  }
  cv_.notify_all();
}

void BackgroundJob::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return !busy_; });
}

std::exception_ptr BackgroundJob::take_error() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(error_, nullptr);
}

void BackgroundJob::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || (busy_ && job_); });
      if (stop_) return;
      job = std::move(job_);
      job_ = nullptr;
    }
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error && !error_) error_ = error;
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace xpert
