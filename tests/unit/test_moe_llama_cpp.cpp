// qwen3moe against llama.cpp: logits of a tiny random model (tests/reference/make_moe_fixtures.py, written
// with the PyPI `gguf` package and evaluated by llama-cpp-python), all positions at once and token by token.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "base/thread_pool.h"
#include "model/model.h"
#include "model/kv_cache.h"

namespace xpert {
namespace {

std::string fixture_dir() {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/";
}

int64_t arg_max(const float* v, int64_t n) { return std::max_element(v, v + n) - v; }

TEST(Qwen3Moe, LogitsMatchLlamaCpp) {
  std::ifstream in(fixture_dir() + "tiny_qwen3moe_logits.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json fx = nlohmann::json::parse(in);
  auto model = Model::load(fixture_dir() + fx["file"].get<std::string>());
  const ModelConfig& c = model->config();
  EXPECT_EQ(c.n_expert, 8);
  EXPECT_EQ(c.n_expert_used, 3);
  EXPECT_EQ(c.n_ff_exp, 32);
  const std::vector<int32_t> tokens = fx["tokens"].get<std::vector<int32_t>>();
  const int64_t V = c.n_vocab;

  ThreadPool pool(2);
  // All at once, then one token at a time: both against llama.cpp (and so against each other).
  KvCache batch_cache(c, 64), step_cache(c, 64);
  std::vector<float> all, one;
  int n_flipped = 0;
  model->forward({.tokens = tokens, .pos0 = 0, .cache = &batch_cache, .seq = 0, .all_logits = true}, all, pool);
  ASSERT_EQ((int64_t)all.size(), (int64_t)tokens.size() * V);
  for (size_t t = 0; t < tokens.size(); ++t) {
    model->forward({.tokens = std::span(tokens).subspan(t, 1), .pos0 = (int32_t)t, .cache = &step_cache, .seq = 0},
                   one, pool);
    const std::vector<float> ref = fx["logits"][t].get<std::vector<float>>();
    ASSERT_EQ((int64_t)ref.size(), V);
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < V; ++i) {
      max_err = std::max(max_err, (double)std::fabs(all[t * V + i] - ref[i]));
      max_err = std::max(max_err, (double)std::fabs(one[i] - ref[i]));
      max_ref = std::max(max_ref, (double)std::fabs(ref[i]));
    }
    // 2e-3 of the largest logit, as the dense fixtures; a few positions may be off by up to 1e-2: there
    // a last-bit difference flipped a near-tie of the router's top-k or an int8 rounding of the
    // activations (with all 8 experts used, 3 of this fixture's 4 such positions agree to 5e-5).
    EXPECT_LT(max_err, 1e-2 * std::max(1.0, max_ref)) << "position " << t;
    if (max_err > 2e-3 * std::max(1.0, max_ref)) ++n_flipped;
    EXPECT_EQ(arg_max(all.data() + t * V, V), arg_max(ref.data(), V)) << "position " << t;
    EXPECT_EQ(arg_max(one.data(), V), arg_max(ref.data(), V)) << "position " << t;
  }
  EXPECT_LE(n_flipped, 4) << "positions off by more than 2e-3 of the largest logit";
}

}  // namespace
}  // namespace xpert
