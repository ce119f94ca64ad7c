// The split MoE's copy count (backend/stream_share.h): fixed shares round as before, auto balances the
// measured copy and host rates.
#include <gtest/gtest.h>

#include "backend/stream_share.h"
#include "base/error.h"

namespace xpert {
namespace {

constexpr size_t kMB = 1000 * 1000;

TEST(StreamShare, FixedShareRoundsTheUsedExperts) {
  StreamShare s(0.5);
  EXPECT_FALSE(s.is_auto());
  EXPECT_EQ(s.copies(8, kMB), 4);
  EXPECT_EQ(s.copies(3, kMB), 2);  // 1.5 rounds away from zero
  s.set(0.4);
  EXPECT_EQ(s.copies(8, kMB), 3);
  s.set(0);
  EXPECT_EQ(s.copies(8, kMB), 0);
  s.set(1);
  EXPECT_EQ(s.copies(8, kMB), 8);
  s.observe_copy(3 * kMB, 60, 10);  // measurements do not move a fixed share
  s.observe_host(5 * kMB, 1);
  EXPECT_EQ(s.copies(8, kMB), 8);
}

TEST(StreamShare, RejectsSharesOutsideZeroToOne) {
  StreamShare s;
  EXPECT_THROW(s.set(1.5), Error);
  EXPECT_THROW(s.set(-0.5), Error);
  EXPECT_TRUE(s.is_auto());
}

TEST(StreamShare, ParsesTheFlag) {
  EXPECT_EQ(parse_stream_share("auto"), StreamShare::kAuto);
  EXPECT_EQ(parse_stream_share("0"), 0.0);
  EXPECT_EQ(parse_stream_share("0.375"), 0.375);
  EXPECT_EQ(parse_stream_share("1"), 1.0);
  for (const char* bad : {"", "half", "1.5", "-0.1", "0.5x", "nan"}) EXPECT_THROW(parse_stream_share(bad), Error) << bad;
}

TEST(StreamShare, AutoStartsAtHalfAndKeepsBothSidesBusy) {
  StreamShare s;
  EXPECT_TRUE(s.is_auto());
  EXPECT_EQ(s.copies(8, kMB), 4);
  EXPECT_EQ(s.copies(1, kMB), 1);  // a lone expert is copied until there is a measurement
  EXPECT_EQ(s.copies(2, kMB), 1);
  EXPECT_EQ(s.copies(0, kMB), 0);
}

// Copies at 50 GB/s (20 us per MB) plus 10 us of GPU MoE, the host at `host_gbs`: auto picks the count that
// minimizes the longer side, which this test computes by hand.
int64_t balanced(double host_gbs, int64_t used) {
  StreamShare s;
  for (int i = 0; i < 200; ++i) {
    s.observe_copy(3 * kMB, 60, 10);
    s.observe_host(5 * kMB, 5 * 1000.0 / host_gbs);
  }
  return s.copies(used, kMB);
}

TEST(StreamShare, AutoBalancesTheMeasuredRates) {
  // host 100 GB/s = 10 us per MB. n copied: max(20n + 10, 10(8 - n)): n = 2 -> max(50, 60) = 60,
  // n = 3 -> max(70, 50) = 70: 2.
  EXPECT_EQ(balanced(100, 8), 2);
  // host 50 GB/s = 20 us per MB: n = 3 -> max(70, 100) = 100, n = 4 -> max(90, 80) = 90, n = 5 -> 110: 4.
  EXPECT_EQ(balanced(50, 8), 4);
  // a very slow host: every expert but one copied; a very fast one: one copied.
  EXPECT_EQ(balanced(1, 8), 7);
  EXPECT_EQ(balanced(10000, 8), 1);
  // more experts used (a batch of a few tokens): the same balance, scaled.
  EXPECT_EQ(balanced(50, 32), 16);  // max(20n + 10, 20(32 - n)): 15 -> 340, 16 -> max(330, 320), 17 -> 350
}

TEST(StreamShare, AutoFollowsAChangeOfRates) {
  StreamShare s;
  for (int i = 0; i < 200; ++i) s.observe_copy(3 * kMB, 60, 10), s.observe_host(5 * kMB, 50);  // host 100 GB/s
  EXPECT_EQ(s.copies(8, kMB), 2);
  for (int i = 0; i < 200; ++i) s.observe_host(5 * kMB, 200);  // the host slows to 25 GB/s
  EXPECT_EQ(s.copies(8, kMB), 5);  // max(20n + 10, 40(8 - n)): n = 5 -> max(110, 120), 6 -> max(130, 80)
}

TEST(StreamShare, SummarySaysWhatWasCopied) {
  StreamShare s;
  EXPECT_EQ(s.summary(), "");
  s.copies(8, kMB);
  s.observe_copy(4 * kMB, 80, 10);
  s.observe_host(4 * kMB, 40);
  EXPECT_NE(s.summary().find("auto: copied 4.00 of 8.00 host experts per call over 1 calls"), std::string::npos)
      << s.summary();
  EXPECT_NE(s.summary().find("PCIe 50.0 GB/s, host 100.0 GB/s"), std::string::npos) << s.summary();
}

}  // namespace
}  // namespace xpert
