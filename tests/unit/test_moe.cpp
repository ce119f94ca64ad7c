// The MoE block: routing (softmax, top-k with ties, renormalization) on hand-made logits, and grouped-
// by-expert execution against the token-by-token reference on random data of real shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "base/thread_pool.h"
#include "backend/cpu/moe.h"
#include "quant/quant.h"

namespace xpert {
namespace {

TEST(MoeRouter, TopKRenormalized) {
  const std::vector<float> logits = {0, 1, 2, 3,  /* token 1 */ 3, 2, 1, 0};
  Routing r;
  cpu::route_top_k(logits.data(), 2, {.n_expert = 4, .k = 2, .norm_weights = true, .weights_scale = 1.0f}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 2, 0, 1}));
  const float w0 = std::exp(1.0f) / (std::exp(1.0f) + 1.0f);
  EXPECT_NEAR(r.weights[0], w0, 1e-6);
  EXPECT_NEAR(r.weights[1], 1 - w0, 1e-6);
  EXPECT_NEAR(r.weights[2], w0, 1e-6);
  EXPECT_NEAR(r.weights[3], 1 - w0, 1e-6);
}

TEST(MoeRouter, TiesTakeTheLowerExpertFirst) {
  const std::vector<float> logits = {1, 3, 3, 2, 3};
  Routing r;
  cpu::route_top_k(logits.data(), 1, {.n_expert = 5, .k = 2}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.5f);
  EXPECT_FLOAT_EQ(r.weights[1], 0.5f);
  cpu::route_top_k(logits.data(), 1, {.n_expert = 5, .k = 3}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 4}));
  for (float w : r.weights) EXPECT_NEAR(w, 1.0f / 3, 1e-7);
  // All equal: the first k experts, equal weights.
  const std::vector<float> flat(8, -7.5f);
  cpu::route_top_k(flat.data(), 1, {.n_expert = 8, .k = 4}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3}));
  for (float w : r.weights) EXPECT_FLOAT_EQ(w, 0.25f);
}

TEST(MoeRouter, WithoutNormalizationTheWeightsAreSoftmaxProbabilities) {
  const std::vector<float> logits = {0, 1000, 0, 999};  // large logits must not overflow
  Routing r;
  cpu::route_top_k(logits.data(), 1, {.n_expert = 4, .k = 2, .norm_weights = false}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(r.weights[0], 1 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(r.weights[1], 1 / (1 + std::exp(1.0)), 1e-6);
  const std::vector<float> l2 = {std::log(1.0f), std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  cpu::route_top_k(l2.data(), 1, {.n_expert = 4, .k = 2, .norm_weights = false, .weights_scale = 2.0f}, r);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 2}));
  EXPECT_NEAR(r.weights[0], 2 * 0.4f, 1e-6);
  EXPECT_NEAR(r.weights[1], 2 * 0.3f, 1e-6);
}

TEST(MoeExperts, ExpertIsASliceOfTheLayerTensor) {
  std::vector<uint8_t> bytes(row_bytes(DType::Q4_K, 512) * 3 * 5);
  Weight w{.type = DType::Q4_K, .data = bytes.data(), .ne = {512, 3, 5}, .n_bytes = bytes.size()};
  const Weight e = expert_matrix(w, 4);
  EXPECT_EQ(e.data, bytes.data() + 4 * 3 * row_bytes(DType::Q4_K, 512));
  EXPECT_EQ(e.ne[0], 512);
  EXPECT_EQ(e.ne[1], 3);
  EXPECT_EQ(e.ne[2], 1);
  EXPECT_EQ(e.n_bytes, 3 * row_bytes(DType::Q4_K, 512));
}

// A 3-D expert tensor of random rows: a pool of quantized random rows, tiled in a shuffled order
// (quantizing 33 M floats to Q4_K one by one would dominate the test's time).
struct RandomTensor {
  std::vector<uint8_t> bytes;
  Weight w;
  RandomTensor(DType t, int64_t k, int64_t n, int64_t x, std::mt19937& rng) {
    const size_t rb = row_bytes(t, k);
    constexpr int64_t kPool = 1024;
    std::vector<uint8_t> pool(rb * kPool);
    std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt((float)k));
    std::vector<float> row(k);
    for (int64_t r = 0; r < kPool; ++r) {
      for (float& v : row) v = normal(rng);
      quantize_row(t, row.data(), pool.data() + r * rb, k);
    }
    bytes.resize(rb * n * x);
    for (int64_t r = 0; r < n * x; ++r) std::memcpy(bytes.data() + r * rb, pool.data() + rng() % kPool * rb, rb);
    w = Weight{.type = t, .data = bytes.data(), .ne = {k, n, x}, .n_bytes = bytes.size()};
  }
};

class MoeGrouped : public ::testing::TestWithParam<int64_t> {};

TEST_P(MoeGrouped, EqualsTokenByTokenReference) {
  const int64_t m = GetParam();
  MoeFfn ffn;
  ffn.n_embd = 1024;
  ffn.n_ff = 512;
  ffn.n_expert = 64;
  ffn.n_used = 8;
  std::mt19937 rng(42 + m);
  std::vector<float> router(ffn.n_embd * ffn.n_expert);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : router) v = normal(rng) * 0.03f;
  RandomTensor gate(DType::Q4_K, ffn.n_embd, ffn.n_ff, ffn.n_expert, rng);
  RandomTensor up(DType::Q4_K, ffn.n_embd, ffn.n_ff, ffn.n_expert, rng);
  RandomTensor down(DType::Q6_K, ffn.n_ff, ffn.n_embd, ffn.n_expert, rng);
  ffn.router = Weight{.type = DType::F32, .data = router.data(), .ne = {ffn.n_embd, ffn.n_expert, 1},
                      .n_bytes = router.size() * 4};
  ffn.gate = gate.w;
  ffn.up = up.w;
  ffn.down = down.w;

  std::vector<float> x(m * ffn.n_embd);
  for (float& v : x) v = normal(rng);
  std::vector<float> want(x.size());
  cpu::moe_ffn_reference(ffn, x.data(), m, want.data());
  double max_ref = 0;
  for (float v : want) max_ref = std::max(max_ref, (double)std::fabs(v));
  ASSERT_GT(max_ref, 0);

  ThreadPool pool(2);
  cpu::MoeScratch s;
  std::vector<float> by_expert(x.size()), by_rows(x.size()), batched(x.size()), automatic(x.size());
  cpu::moe_ffn(ffn, x.data(), m, by_expert.data(), s, pool, cpu::MoeSchedule::by_expert);
  cpu::moe_ffn(ffn, x.data(), m, by_rows.data(), s, pool, cpu::MoeSchedule::by_rows);
  cpu::moe_ffn(ffn, x.data(), m, batched.data(), s, pool, cpu::MoeSchedule::batched);
  cpu::moe_ffn(ffn, x.data(), m, automatic.data(), s, pool);
  double max_err = 0;
  for (size_t i = 0; i < want.size(); ++i) max_err = std::max(max_err, (double)std::fabs(by_expert[i] - want[i]));
  EXPECT_LT(max_err, 2e-3 * max_ref) << "m = " << m << ", max |ref| = " << max_ref;
  // The schedules only change which thread computes what: the same bits.
  EXPECT_EQ(by_expert, by_rows);
  // batched runs the tile kernels at every row count; cpu::matmul switches to the panel kernels at 8
  // rows (other summation order): the same bits only below that.
  if (m < 8) {
    EXPECT_EQ(by_expert, batched);
  } else {
    double batched_err = 0;
    for (size_t i = 0; i < want.size(); ++i) batched_err = std::max(batched_err, (double)std::fabs(batched[i] - want[i]));
    EXPECT_LT(batched_err, 2e-3 * max_ref);
  }
  EXPECT_EQ(by_expert, automatic);
  // And each token's result does not depend on the other tokens of the batch: the same bits while every
  // expert sees fewer than 8 rows; past that the panel kernels sum in another order (last-bit differences).
  std::vector<float> one(ffn.n_embd);
  cpu::moe_ffn(ffn, x.data() + (m - 1) * ffn.n_embd, 1, one.data(), s, pool);
  for (int64_t i = 0; i < ffn.n_embd; ++i) {
    if (m < 8) EXPECT_EQ(one[i], by_expert[(m - 1) * ffn.n_embd + i]) << i;
    else EXPECT_NEAR(one[i], by_expert[(m - 1) * ffn.n_embd + i], 1e-5 * max_ref) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Moe, MoeGrouped, ::testing::Values(1, 7, 64));

}  // namespace
}  // namespace xpert
