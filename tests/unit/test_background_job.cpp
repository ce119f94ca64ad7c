// base/background_job.h: jobs run one at a time on another thread, wait() orders after them, errors are kept.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/background_job.h"

namespace xpert {
namespace {

TEST(BackgroundJob, RunsJobsInOrderOnItsOwnThread) {
  BackgroundJob job;
  std::vector<int> seen;  // written only by the job thread, read after wait()
  std::thread::id where;
  for (int i = 0; i < 100; ++i)
    job.submit([&, i] {
      seen.push_back(i);
      where = std::this_thread::get_id();
    });
  job.wait();
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_NE(where, std::this_thread::get_id());
  EXPECT_EQ(job.take_error(), nullptr);
}

TEST(BackgroundJob, WaitReturnsAfterTheJobFromAnotherThread) {
  BackgroundJob job;
  std::atomic<bool> done{false};
  job.submit([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    done = true;
  });
  bool seen_done = false;
  std::thread other([&] {  // as a CUDA host function would
    job.wait();
    seen_done = done.load();
  });
  other.join();
  EXPECT_TRUE(seen_done);
}

TEST(BackgroundJob, KeepsTheFirstErrorAndGoesOn) {
  BackgroundJob job;
  job.submit([] { throw std::runtime_error("first"); });
  job.submit([] { throw std::runtime_error("second"); });
  int ran = 0;
  job.submit([&] { ran = 1; });
  job.wait();
  EXPECT_EQ(ran, 1);
  std::exception_ptr e = job.take_error();
  ASSERT_NE(e, nullptr);
  try {
    std::rethrow_exception(e);
  } catch (const std::runtime_error& r) {
    EXPECT_STREQ(r.what(), "first");
  }
  EXPECT_EQ(job.take_error(), nullptr);
}

TEST(BackgroundJob, DestructorWaitsForTheJob) {
  std::atomic<int> ran{0};
  {
    BackgroundJob job;
    job.submit([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ran = 1;
    });
  }
  EXPECT_EQ(ran.load(), 1);
}

}  // namespace
}  // namespace xpert
