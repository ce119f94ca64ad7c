// Model-level checks against llama.cpp (fixtures recorded by tests/reference/make_*_fixtures.py with
// the PyPI package llama-cpp-python): logits of tiny random llama/qwen2/qwen3 models, and greedy
// continuations of the real small test model (models/gemma3-270m.gguf, Gemma 3 270M Q4_K_M).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/model.h"
#include "model/kv_cache.h"
#include "runtime/session.h"
#include "sample/sampler.h"
#include "text/tokenizer.h"

namespace xpert {
namespace {

std::string source_dir() {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return e ? e : XPERT_SOURCE_DIR;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

class TinyDense : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyDense, LogitsMatchLlamaCpp) {
  const std::string dir = source_dir() + "/tests/reference/fixtures/";
  const nlohmann::json fx = read_json(dir + "tiny_dense_logits.json");
  const nlohmann::json& m = fx["models"][GetParam()];
  auto model = Model::load(dir + m["file"].get<std::string>());
  const std::vector<int32_t> tokens = fx["tokens"].get<std::vector<int32_t>>();
  const int64_t V = model->config().n_vocab;

  ThreadPool pool(2);
  // All at once, then one token at a time: both must match llama.cpp, and each other's argmax.
  // At n_embd 64 one activation that rounds to the other int8 level (a last-bit difference in float
  // summation order decides it) moves the logits by up to ~1e-2 of their range, so a couple of
  // positions may sit between the tight and the loose bound; a real bug moves every position by O(1).
  int loose = 0;
  KvCache batch_cache(model->config(), 64), step_cache(model->config(), 64);
  std::vector<float> all, one;
  model->forward({.tokens = tokens, .pos0 = 0, .cache = &batch_cache, .seq = 0, .all_logits = true}, all, pool);
  ASSERT_EQ((int64_t)all.size(), (int64_t)tokens.size() * V);
  for (size_t t = 0; t < tokens.size(); ++t) {
    model->forward({.tokens = std::span(tokens).subspan(t, 1), .pos0 = (int32_t)t, .cache = &step_cache, .seq = 0},
                   one, pool);
    const std::vector<float> ref = m["logits"][t].get<std::vector<float>>();
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < V; ++i) {
      max_err = std::max(max_err, (double)std::fabs(all[t * V + i] - ref[i]));
      max_err = std::max(max_err, (double)std::fabs(one[i] - ref[i]));
      max_ref = std::max(max_ref, (double)std::fabs(ref[i]));
    }
    EXPECT_LT(max_err, 2e-2 * std::max(1.0, max_ref)) << GetParam() << " position " << t;
    if (max_err >= 2e-3 * std::max(1.0, max_ref)) ++loose;
    EXPECT_EQ(argmax(std::span(all).subspan(t * V, V)), argmax(ref)) << GetParam() << " position " << t;
  }
  EXPECT_LE(loose, 2) << GetParam() << ": positions beyond 2e-3 of the logit range";
}

// Continuous batching: two sequences in one batch give the logits each gives alone.
TEST_P(TinyDense, MixedBatchEqualsSeparateSequences) {
  const std::string dir = source_dir() + "/tests/reference/fixtures/";
  const nlohmann::json fx = read_json(dir + "tiny_dense_logits.json");
  auto model = Model::load(dir + fx["models"][GetParam()]["file"].get<std::string>());
  const std::vector<int32_t> tokens = fx["tokens"].get<std::vector<int32_t>>();
  const int64_t V = model->config().n_vocab;
  ThreadPool pool(2);
  KvCache cache(model->config(), 64, 2), alone(model->config(), 64, 1);
  std::vector<float> mixed, a;
  // Slot 0 gets the first 10 tokens, slot 1 the next 14; then one decode step for both in one batch.
  const std::vector<BatchSegment> prefill = {{.seq = 0, .pos0 = 0, .n_tokens = 10}, {.seq = 1, .pos0 = 0, .n_tokens = 14, .all_logits = true}};
  model->forward({.tokens = tokens, .cache = &cache, .segments = prefill}, mixed, pool);
  ASSERT_EQ((int64_t)mixed.size(), (1 + 14) * V);
  const std::vector<int32_t> step = {5, 6};
  const std::vector<BatchSegment> decode = {{.seq = 0, .pos0 = 10, .n_tokens = 1}, {.seq = 1, .pos0 = 14, .n_tokens = 1}};
  std::vector<float> mixed_step;
  model->forward({.tokens = step, .cache = &cache, .segments = decode}, mixed_step, pool);

  std::vector<int32_t> seq0(tokens.begin(), tokens.begin() + 10), seq1(tokens.begin() + 10, tokens.end());
  model->forward({.tokens = seq0, .pos0 = 0, .cache = &alone}, a, pool);
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(a[i], mixed[i], 1e-4);
  model->forward({.tokens = std::span(step).subspan(0, 1), .pos0 = 10, .cache = &alone}, a, pool);
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(a[i], mixed_step[i], 1e-4);
  model->forward({.tokens = seq1, .pos0 = 0, .cache = &alone, .all_logits = true}, a, pool);
  for (int64_t i = 0; i < 14 * V; ++i) EXPECT_NEAR(a[i], mixed[V + i], 1e-4);
  model->forward({.tokens = std::span(step).subspan(1, 1), .pos0 = 14, .cache = &alone}, a, pool);
  for (int64_t i = 0; i < V; ++i) EXPECT_NEAR(a[i], mixed_step[V + i], 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Models, TinyDense, ::testing::Values("llama", "qwen2", "qwen3"));

// Gemma 3's residual stream reaches ~1e5 and its KV cache is f16, so a last-bit difference in float
// summation order (xpert's kernels and llama.cpp's add in different orders) becomes f16 ulps and the
// logits of the two engines differ by ~0.15 (std), about as much as each differs from a float64
// evaluation. So greedy tokens must be identical until llama.cpp itself had a near-tie: at the first
// difference xpert's token must be among llama.cpp's top five there, with llama.cpp's own logit gap
// (between xpert's token and its own choice) below kTieMargin; the continuation after that point is a
// different text and is not compared. (Bit-identical output would need llama.cpp's exact float
// summation order in every kernel, which even differs between its own AVX2, AVX-512 and
// repacked-weight code paths.)
// Top-5 logits of each prompt's last token: each within kLogitTolerance, and their RMS difference
// within kLogitRms (measured 2026-11-30: RMS 0.2, max 0.61).
constexpr float kTieMargin = 0.5f;
constexpr float kLogitTolerance = 1.0f;
constexpr double kLogitRms = 0.35;

TEST(DefaultModel, GreedyMatchesLlamaCpp) {
  const std::string path = source_dir() + "/models/gemma3-270m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no models/gemma3-270m.gguf (run scripts/setup.sh)";
  const nlohmann::json fx = read_json(source_dir() + "/tests/reference/fixtures/default_greedy.json");
  auto model = Model::load(path);
  auto tok = Tokenizer::from_gguf(model->file());
  Session s(*model, {.n_ctx = fx["n_ctx"].get<int64_t>(), .n_threads = 2, .n_batch = 512});
  size_t matched = 0, total = 0, n_logits = 0;
  double sq_err = 0;
  for (const auto& c : fx["cases"]) {
    const std::string name = c["name"];
    const auto prompt = tok->encode(c["prompt"].get<std::string>(), true, true);
    ASSERT_EQ(prompt, c["prompt_ids"].get<std::vector<int32_t>>()) << name;
    s.reset();
    std::vector<float> logits = s.eval(prompt);
    const auto top5 = c["top5_ids"].get<std::vector<int32_t>>();
    const auto top5_logits = c["top5_logits"].get<std::vector<float>>();
    for (size_t i = 0; i < top5.size(); ++i) {
      EXPECT_NEAR(logits[top5[i]], top5_logits[i], kLogitTolerance) << name << " rank " << i;
      sq_err += std::pow(logits[top5[i]] - top5_logits[i], 2);
      ++n_logits;
    }

    const auto want = c["greedy_ids"].get<std::vector<int32_t>>();
    const auto& alternatives = c["greedy_alternatives"];  // per step: llama.cpp's next 4 [id, gap to its choice]
    total += want.size();
    for (size_t i = 0; i < want.size(); ++i) {
      const int32_t id = argmax(logits);
      if (id != want[i]) {
        float gap = INFINITY;
        for (const auto& alt : alternatives[i])
          if (alt[0].get<int32_t>() == id) gap = alt[1].get<float>();
        EXPECT_LT(gap, kTieMargin) << name << " step " << i << ": xpert chose " << id << " '"
                                   << tok->token_to_piece(id, true) << "', llama.cpp " << want[i] << " '"
                                   << tok->token_to_piece(want[i], true) << "' (llama.cpp's gap between them: " << gap << ")";
        break;
      }
      ++matched;
      logits = s.eval(std::span<const int32_t>(&id, 1));
    }
  }
  const double rms = std::sqrt(sq_err / n_logits);
  EXPECT_LT(rms, kLogitRms);
  std::printf("[          ] %zu of %zu greedy tokens identical to llama.cpp before a near-tie; top-5 logit RMS diff %.3f\n",
              matched, total, rms);
}

}  // namespace
}  // namespace xpert

namespace xpert {
namespace {

// Cutting a session back and continuing gives what a fresh session gives for the same tokens; a hybrid
// model (recurrent state) starts over instead.
TEST(Session, TruncateThenContinueEqualsFresh) {
  const std::string dir = source_dir() + "/tests/reference/fixtures/";
  for (const char* file : {"tiny_qwen3.gguf", "tiny_qwen35.gguf"}) {
    auto model = Model::load(dir + file);
    const bool hybrid = model->config().has_recurrent_layers();
    const std::vector<int32_t> a = {1, 17, 42, 99, 5, 300, 7, 7}, b = {128, 250, 64};
    Session s(*model, {.n_ctx = 64, .n_threads = 2});
    s.eval(a);
    const bool kept = s.truncate(5);
    EXPECT_EQ(kept, !hybrid) << file;
    std::vector<int32_t> rest(a.begin(), a.begin() + 5);
    rest.insert(rest.end(), b.begin(), b.end());
    const std::vector<float> got = kept ? s.eval(b) : s.eval(rest);
    Session fresh(*model, {.n_ctx = 64, .n_threads = 2});
    const std::vector<float> want = fresh.eval(rest);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-3) << file << " " << i;
    EXPECT_THROW(s.truncate(1000), Error);
  }
}

}  // namespace
}  // namespace xpert
