// Greedy sampling (temperature 0) picks the first highest logit, as the plain one-pass loop does: on a
// vocabulary-sized row with ties planted before and after the maximum, NaNs, -inf, and short rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "sample/sampler.h"

namespace xpert {
namespace {

int32_t reference_argmax(const std::vector<float>& v) {  // NaN never wins
  int32_t best = -1;
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isnan(v[i]) && (best < 0 || v[i] > v[best])) best = (int32_t)i;
  return best < 0 ? 0 : best;
}

int32_t greedy(const std::vector<float>& v) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  return s.sample(v);
}

TEST(SamplerGreedy, FirstHighestOnRandomRows) {
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  for (size_t n : {1u, 2u, 7u, 8u, 9u, 17u, 1000u, 151936u}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> v(n);
      for (float& x : v) x = logit(rng);
      std::uniform_int_distribution<size_t> at(0, n - 1);
      if (trial == 1) v[at(rng)] = std::numeric_limits<float>::quiet_NaN();
      if (trial == 2) v[at(rng)] = -std::numeric_limits<float>::infinity();
      if (trial >= 3) {  // the maximum at several places: the first wins
        const float top = 100.0f + trial;
        for (int c = 0; c < trial; ++c) v[at(rng)] = top;
      }
      if (trial == 5 && n > 1) v[n - 1] = 200.0f;  // in the tail past the last whole group of 8
      EXPECT_EQ(greedy(v), reference_argmax(v)) << "n " << n << " trial " << trial;
    }
  }
}

TEST(SamplerGreedy, DegenerateRows) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(greedy(std::vector<float>(20, -inf)), 0);
  EXPECT_EQ(greedy(std::vector<float>(20, nan)), 0);
  std::vector<float> v(20, nan);
  v[13] = -5.0f;
  EXPECT_EQ(greedy(v), 13);
  v[3] = inf;
  EXPECT_EQ(greedy(v), 3);
}

}  // namespace
}  // namespace xpert
