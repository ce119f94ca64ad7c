#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include "base/half.h"
#include "base/thread_pool.h"

namespace xpert {

TEST(Half, RoundTripsAllHalves) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32((uint16_t)h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << h;
  }
}

TEST(Half, RoundsToNearestEven) {
  // 1 + 2^-11 is exactly between 1 and the next half: ties go to even (1.0).
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (zero)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(Half, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(3.140625f)), 3.140625f);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000)), 0x3f82);  // tie, odd rounds up
}

TEST(ThreadPool, ParallelForCoversRangeOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 7, 100, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    }, 4);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1);
  }
}

// Slots go to whichever thread claims them first (the caller takes those no worker has started), so
// back-to-back runs, some with slow slots, must still run each slot exactly once per run.
TEST(ThreadPool, EverySlotRunsOncePerRun) {
  ThreadPool pool(3);
  std::atomic<int> hits[3] = {};
  for (int run = 0; run < 2000; ++run) {
    pool.run([&](int ith, int nth) {
      ASSERT_EQ(nth, 3);
      hits[ith]++;
      if (run % 100 == ith) std::this_thread::sleep_for(std::chrono::microseconds(200));
    });
    for (int i = 0; i < 3; ++i) ASSERT_EQ(hits[i].load(), run + 1) << "slot " << i << " run " << run;
  }
}

}  // namespace xpert
