// A seeded request's tokens and log-probabilities have the same bits alone, batched with other requests'
// prefill chunks, and resumed from the state cache (issue #37), on the tiny qwen3 fixture whose quantized
// matrices take AVX-512's panel kernels from 8 rows on. Every CPU kernel takes one float order per row, so
// this holds with cpu::set_batch_invariant on (what `xpert serve` states) and off alike.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backend/cpu/matmul.h"
#include "runtime/engine.h"
#include "text/tokenizer.h"

namespace xpert {
namespace {

std::string fixture() {
  const char* dir = std::getenv("XPERT_SOURCE_DIR");
  return std::string(dir ? dir : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/tiny_qwen3.gguf";
}

std::vector<int32_t> prompt(int i, int len) {
  std::vector<int32_t> p = {1};
  for (int k = 0; k < len; ++k) p.push_back(3 + (k * 37 + i * 11) % 300);
  return p;
}

struct Output {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
};

Output run(const Job::Update& u) {
  Output r;
  for (const TokenLogprob& lp : u.logprobs) {
    r.ids.push_back(lp.id);
    r.logprobs.push_back(lp.logprob);
  }
  return r;
}

GenerateParams seeded(std::vector<int32_t> p, int64_t max_tokens) {
  GenerateParams g;
  g.prompt = std::move(p);
  g.sampling.temperature = 0.8f;
  g.sampling.seed = 1234;
  g.max_tokens = max_tokens;
  g.top_logprobs = 0;
  return g;
}

class EngineDeterminism : public testing::TestWithParam<bool> {};

TEST_P(EngineDeterminism, SeededRequestIgnoresTrafficAndCache) {
  struct Reset {
    ~Reset() { cpu::set_batch_invariant(false); }
  } reset;
  cpu::set_batch_invariant(GetParam());
  auto model = Model::load(fixture());
  auto tok = Tokenizer::from_gguf(model->file());
  const EngineOptions opts{.n_parallel = 3, .n_ctx = 256, .n_threads = 2, .prefill_chunk = 32,
                           .cache_ram_bytes = 64 << 20};
  const std::vector<int32_t> mine = prompt(1, 40);

  Output alone;
  {
    Engine engine(*model, *tok, opts);
    alone = run(engine.submit(seeded(mine, 24))->wait_all());
  }
  ASSERT_GT(alone.ids.size(), 4u);

  Engine engine(*model, *tok, opts);
  // With two long prompts prefilling in the same steps as this request's decode.
  auto a = engine.submit(seeded(prompt(5, 150), 8));
  auto b = engine.submit(seeded(prompt(6, 120), 8));
  const Output busy = run(engine.submit(seeded(mine, 24))->wait_all());
  a->wait_all();
  b->wait_all();
  // Again, now resumed from the cached prompt (only its last token evaluated, alone).
  auto again_job = engine.submit(seeded(mine, 24));
  const Output again = run(again_job->wait_all());
  EXPECT_GT(again_job->n_cached(), 0);

  EXPECT_EQ(busy.ids, alone.ids);
  EXPECT_EQ(busy.logprobs, alone.logprobs);
  EXPECT_EQ(again.ids, alone.ids);
  EXPECT_EQ(again.logprobs, alone.logprobs);
}

INSTANTIATE_TEST_SUITE_P(BatchInvariantSwitch, EngineDeterminism, testing::Bool());

}  // namespace
}  // namespace xpert
