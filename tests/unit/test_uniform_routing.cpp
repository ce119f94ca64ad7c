// `--routing uniform` (RouterParams::uniform_seed, backend/uniform_routing.h): each token's top k drawn
// uniformly at random, deterministic in the seed. On logits that always pick the same experts, and on a
// synth MoE model, the expert counts come out near uniform; the same seed gives the same routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "backend/cpu/moe.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/experts/routing_stats.h"
#include "runtime/session.h"
#include "test_data.h"

namespace xpert {
namespace {

// Every count within 6 standard deviations of n_tokens * k / E (a binomial's, per expert).
void expect_near_uniform(const std::vector<uint64_t>& counts, int64_t n_tokens, int64_t k) {
  const double E = (double)counts.size(), p = (double)k / E, mean = (double)n_tokens * p;
  const double sd = std::sqrt((double)n_tokens * p * (1 - p));
  for (size_t e = 0; e < counts.size(); ++e)
    EXPECT_NEAR((double)counts[e], mean, 6 * sd) << "expert " << e << " of " << counts.size();
}

TEST(UniformRouting, SpreadsLogitsThatAlwaysPickTheSameExperts) {
  const int64_t n = 4096, E = 128, k = 8;
  std::vector<float> logits = random_values(n * E, 7);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < k; ++e) logits[t * E + e] += 10.0f;  // the router's choice: experts 0..7
  Routing model, uniform, again, other;
  const RouterParams p{.n_expert = E, .k = k};
  cpu::route_top_k(logits.data(), n, p, model);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) ASSERT_LT(model.ids[t * k + j], k);
  RouterParams u = p;
  u.uniform_seed = 1;
  cpu::route_top_k(logits.data(), n, u, uniform);
  std::vector<uint64_t> counts(E, 0);
  for (int64_t t = 0; t < n; ++t) {
    std::set<int32_t> distinct(uniform.ids.begin() + t * k, uniform.ids.begin() + (t + 1) * k);
    EXPECT_EQ((int64_t)distinct.size(), k) << "token " << t;
    double wsum = 0;
    for (int64_t j = 0; j < k; ++j) {
      ++counts[uniform.ids[t * k + j]];
      wsum += uniform.weights[t * k + j];
    }
    EXPECT_NEAR(wsum, 1.0, 1e-5);  // still the layer's normalized weights
  }
  expect_near_uniform(counts, n, k);
  cpu::route_top_k(logits.data(), n, u, again);
  EXPECT_EQ(again.ids, uniform.ids);
  u.uniform_seed = 2;
  cpu::route_top_k(logits.data(), n, u, other);
  EXPECT_NE(other.ids, uniform.ids);
}

// The routing counted over a prompt of random tokens on a synth MoE (2 layers, 8 experts, top 2).
std::vector<std::vector<uint64_t>> count_routing(Model& model, uint32_t seed, const std::vector<int32_t>& prompt) {
  model.set_uniform_routing(seed);
  RoutingStats stats(model);
  Session s(model, {.n_ctx = (int64_t)prompt.size() + 1, .n_threads = 2, .routing_stats = &stats});
  s.eval(prompt);
  std::vector<std::vector<uint64_t>> out;
  for (int64_t il = 0; il < stats.n_layer(); ++il) out.push_back(stats.layer_counts(il));
  return out;
}

TEST(UniformRouting, SynthMoeCountsComeOutNearUniform) {
  TempFile file("uniform_routing.gguf");
  synth_write({.preset = "tiny-qwen3moe", .type = "Q4_K_M", .output = file.path, .seed = 3});
  auto model = Model::load(file.path);
  const ModelConfig& c = model->config();
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, (int32_t)c.n_vocab - 1);
  std::vector<int32_t> prompt(1024);
  for (int32_t& t : prompt) t = tok(rng);
  const auto routed = count_routing(*model, 0, prompt);
  const auto uniform = count_routing(*model, 9, prompt);
  ASSERT_EQ((int64_t)uniform.size(), c.n_layer);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    uint64_t total = 0;
    for (uint64_t v : uniform[il]) total += v;
    EXPECT_EQ(total, prompt.size() * (size_t)c.n_expert_used);
    expect_near_uniform(uniform[il], (int64_t)prompt.size(), c.n_expert_used);
  }
  EXPECT_NE(routed, uniform);
  EXPECT_EQ(count_routing(*model, 9, prompt), uniform);  // deterministic from the seed
}

}  // namespace
}  // namespace xpert
