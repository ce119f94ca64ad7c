// qwen35 / qwen35moe (hybrid Gated DeltaNet + gated attention) against llama.cpp: tiny random models
// recorded by tests/reference/make_qwen35_fixtures.py. Prefill (chunked delta rule) and token-by-token
// decode (recurrent delta rule) must both match llama.cpp; several sequences in one batch must each use
// their own recurrent state; loader errors name the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/thread_pool.h"
#include "format/gguf.h"
#include "model/model.h"
#include "model/kv_cache.h"
#include "model/recurrent_state.h"
#include "runtime/session.h"
#include "sample/sampler.h"

namespace xpert {
namespace {

std::string fixture_dir() {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/";
}

nlohmann::json read_fixture() {
  std::ifstream in(fixture_dir() + "tiny_qwen35_logits.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

class Qwen35Tiny : public ::testing::TestWithParam<std::string> {};

TEST_P(Qwen35Tiny, LogitsMatchLlamaCpp) {
  const nlohmann::json fx = read_fixture();
  const nlohmann::json& m = fx["models"][GetParam()];
  auto model = Model::load(fixture_dir() + m["file"].get<std::string>());
  ASSERT_TRUE(model->config().has_recurrent_layers());
  const std::vector<int32_t> tokens = fx["tokens"].get<std::vector<int32_t>>();
  const int64_t V = model->config().n_vocab;

  ThreadPool pool(2);
  // All at once (chunked delta rule), then one token at a time (recurrent): both must match llama.cpp.
  KvCache batch_cache(model->config(), 64), step_cache(model->config(), 64);
  RecurrentState batch_state(model->config()), step_state(model->config());
  std::vector<float> all, one;
  model->forward({.tokens = tokens,
                  .pos0 = 0,
                  .cache = &batch_cache,
                  .seq = 0,
                  .all_logits = true,
                  .state = &batch_state},
                 all, pool);
  ASSERT_EQ((int64_t)all.size(), (int64_t)tokens.size() * V);
  double worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    model->forward({.tokens = std::span(tokens).subspan(t, 1),
                    .pos0 = (int32_t)t,
                    .cache = &step_cache,
                    .seq = 0,
                    .state = &step_state},
                   one, pool);
    const std::vector<float> ref = m["logits"][t].get<std::vector<float>>();
    double max_err = 0, max_ref = 0, max_self = 0;
    for (int64_t i = 0; i < V; ++i) {
      max_err = std::max(max_err, (double)std::fabs(all[t * V + i] - ref[i]));
      max_err = std::max(max_err, (double)std::fabs(one[i] - ref[i]));
      max_self = std::max(max_self, (double)std::fabs(all[t * V + i] - one[i]));
      max_ref = std::max(max_ref, (double)std::fabs(ref[i]));
    }
    worst = std::max(worst, max_err / std::max(1.0, max_ref));
    EXPECT_LT(max_err, 2e-3 * std::max(1.0, max_ref)) << GetParam() << " position " << t;
    EXPECT_LT(max_self, 1e-3 * std::max(1.0, max_ref)) << GetParam() << " position " << t;
    EXPECT_EQ(argmax(std::span(all).subspan(t * V, V)), argmax(ref)) << GetParam() << " position " << t;
    EXPECT_EQ(argmax(one), argmax(ref)) << GetParam() << " position " << t;
  }
  std::printf("%s: max |xpert - llama.cpp| / max|logit| = %.2e over %zu positions\n", GetParam().c_str(),
              worst, tokens.size());
}

// Continuous batching: two sequences in one batch give the logits each gives alone, each through its
// own slot's recurrent state.
TEST_P(Qwen35Tiny, MixedBatchEqualsSeparateSequences) {
  const nlohmann::json fx = read_fixture();
  auto model = Model::load(fixture_dir() + fx["models"][GetParam()]["file"].get<std::string>());
  const std::vector<int32_t> tokens = fx["tokens"].get<std::vector<int32_t>>();
  const ModelConfig& c = model->config();
  const int64_t V = c.n_vocab;
  ThreadPool pool(2);
  KvCache cache(c, 64, 2), alone(c, 64, 1);
  RecurrentState state(c, 2), alone_state(c, 1);
  std::vector<float> mixed, a;
  const std::vector<BatchSegment> prefill = {{.seq = 0, .pos0 = 0, .n_tokens = 10},
                                             {.seq = 1, .pos0 = 0, .n_tokens = 14, .all_logits = true}};
  model->forward({.tokens = tokens, .cache = &cache, .segments = prefill, .state = &state}, mixed, pool);
  ASSERT_EQ((int64_t)mixed.size(), (1 + 14) * V);
  const std::vector<int32_t> step = {5, 6};
  std::vector<float> mixed_step, mixed_step2;
  const std::vector<BatchSegment> decode = {{.seq = 0, .pos0 = 10, .n_tokens = 1},
                                            {.seq = 1, .pos0 = 14, .n_tokens = 1}};
  model->forward({.tokens = step, .cache = &cache, .segments = decode, .state = &state}, mixed_step, pool);
  // Slots in the other order, one more step each.
  const std::vector<BatchSegment> decode2 = {{.seq = 1, .pos0 = 15, .n_tokens = 1},
                                             {.seq = 0, .pos0 = 11, .n_tokens = 1}};
  model->forward({.tokens = step, .cache = &cache, .segments = decode2, .state = &state}, mixed_step2, pool);

  std::vector<int32_t> seq0(tokens.begin(), tokens.begin() + 10), seq1(tokens.begin() + 10, tokens.end());
  auto run = [&](std::span<const int32_t> t, int32_t pos0, bool all_logits) {
    model->forward(
        {.tokens = t, .pos0 = pos0, .cache = &alone, .all_logits = all_logits, .state = &alone_state}, a,
        pool);
  };
  run(seq0, 0, false);
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(a[i], mixed[i], 1e-4);
  run(std::span(step).subspan(0, 1), 10, false);
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(a[i], mixed_step[i], 1e-4);
  run(std::span(step).subspan(1, 1), 11, false);
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(a[i], mixed_step2[V + i], 1e-4);
  run(seq1, 0, true);  // position 0 restarts the slot's recurrent state
  for (int64_t i = 0; i < 14 * V; ++i) EXPECT_NEAR(a[i], mixed[V + i], 1e-4);
  run(std::span(step).subspan(1, 1), 14, false);
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(a[i], mixed_step[V + i], 1e-4);
  run(std::span(step).subspan(0, 1), 15, false);
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(a[i], mixed_step2[i], 1e-4);
}

// The session owns the recurrent state: chunked prefill equals one prefill, reset() starts over, and a
// batch that does not continue the state's position is refused rather than silently wrong.
TEST_P(Qwen35Tiny, SessionChunksResetAndRewind) {
  const nlohmann::json fx = read_fixture();
  auto model = Model::load(fixture_dir() + fx["models"][GetParam()]["file"].get<std::string>());
  const std::vector<int32_t> tokens = fx["tokens"].get<std::vector<int32_t>>();
  Session whole(*model, {.n_ctx = 64, .n_threads = 2, .n_batch = 512});
  Session chunked(*model, {.n_ctx = 64, .n_threads = 2, .n_batch = 5});
  const std::vector<float> a = whole.eval(tokens);
  const std::vector<float> b = chunked.eval(tokens);
  ASSERT_EQ(a.size(), b.size());
  // Different batch shapes sum in different orders (matmul tiles, the MoE schedule): close, not equal.
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-2);
  EXPECT_EQ(argmax(a), argmax(b));
  whole.reset();
  const std::vector<float> again = whole.eval(tokens);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], again[i]);

  ThreadPool pool(2);
  KvCache cache(model->config(), 64);
  RecurrentState state(model->config());
  std::vector<float> logits;
  model->forward({.tokens = std::span(tokens).subspan(0, 8), .pos0 = 0, .cache = &cache, .state = &state},
                 logits, pool);
  EXPECT_EQ(state.n_pos(0), 8);
  EXPECT_THROW(
      model->forward({.tokens = std::span(tokens).subspan(4, 4), .pos0 = 4, .cache = &cache, .state = &state},
                     logits, pool),
      Error);
  EXPECT_THROW(
      model->forward({.tokens = std::span(tokens).subspan(0, 4), .pos0 = 0, .cache = &cache}, logits, pool),
      Error);
}

INSTANTIATE_TEST_SUITE_P(Models, Qwen35Tiny, ::testing::Values("qwen35", "qwen35moe"));

// Copies the tiny qwen35 file with one tensor dropped or given another shape; loading must fail naming it.
std::string load_error(const std::string& drop, const std::vector<int64_t>& reshape = {}) {
  auto f = gguf::GGUFFile::open(fixture_dir() + "tiny_qwen35.gguf");
  gguf::GGUFWriter w(f->alignment());
  for (const auto& [k, v] : f->metadata()) w.set(k, v);
  for (const gguf::TensorInfo& t : f->tensors()) {
    if (t.name != drop)
      w.add_tensor(t.name, t.type, t.shape, t.data, t.n_bytes);
    else if (!reshape.empty())
      w.add_tensor(t.name, t.type, reshape, t.data, t.n_bytes);
  }
  const std::string path = testing::TempDir() + "qwen35_broken.gguf";
  w.write(path);
  try {
    Model::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Qwen35Loader, MissingAndMisshapedTensorsAreNamed) {
  EXPECT_NE(load_error("blk.0.ssm_conv1d.weight").find("'blk.0.ssm_conv1d.weight' is missing"),
            std::string::npos);
  EXPECT_NE(load_error("blk.2.attn_q.weight").find("'blk.2.attn_q.weight' is missing"), std::string::npos);
  // ssm_a [4] given as [2, 2]: same bytes, wrong shape.
  const std::string e = load_error("blk.1.ssm_a", {2, 2});
  EXPECT_NE(e.find("'blk.1.ssm_a' has shape [2, 2], expected [4]"), std::string::npos) << e;
}

}  // namespace
}  // namespace xpert
