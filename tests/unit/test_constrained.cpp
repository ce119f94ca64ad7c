// Constrained decoding through the engine on the tiny qwen3 fixture (random weights, so the model itself
// never writes the grammar's text): every output is a sentence of the grammar and ends with "stop";
// logit_bias bans and forces tokens.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "runtime/engine.h"
#include "text/tokenizer.h"

namespace xpert {
namespace {

std::string fixture() {
  const char* dir = std::getenv("XPERT_SOURCE_DIR");
  return std::string(dir ? dir : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/tiny_qwen3.gguf";
}

struct ConstrainedTest : ::testing::Test {
  void SetUp() override {
    model = Model::load(fixture());
    tok = Tokenizer::from_gguf(model->file());
  }
  GenerateParams params(float temperature, uint64_t seed) const {
    GenerateParams g;
    g.prompt = {1, 17, 42, 99, 7};
    g.sampling.temperature = temperature;
    g.sampling.seed = seed;
    g.max_tokens = 60;
    g.top_logprobs = 0;  // to get the ids back
    return g;
  }
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
};

bool full_match(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.complete();
}

TEST_F(ConstrainedTest, EveryOutputIsASentenceOfTheGrammar) {
  const auto grammar = Grammar::parse(R"G(
root ::= "{\"n\": " ( [1-9] [0-9]{0,2} | "0" ) ", \"ok\": " ("true" | "false") ", \"s\": \"" [a-z ]{2,8} "\"}"
)G");
  Engine engine(*model, *tok, {.n_parallel = 3, .n_ctx = 256, .n_threads = 2, .prefill_chunk = 8});
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 9; ++i) {
    GenerateParams p = params(i == 0 ? 0.0f : 1.0f, 100 + i);
    p.grammar = grammar;
    jobs.push_back(engine.submit(std::move(p)));
  }
  std::set<std::string> distinct;
  for (auto& job : jobs) {
    const Job::Update u = job->wait_all();
    EXPECT_EQ(u.finish, Finish::stop) << u.text << u.error;
    EXPECT_TRUE(full_match(grammar, u.text)) << u.text;
    distinct.insert(u.text);
  }
  EXPECT_GT(distinct.size(), 3u);  // sampling still samples
}

TEST_F(ConstrainedTest, EndOfGenerationOnlyWhenComplete) {
  // Complete after one digit but may go on: the output is digits, cut by max_tokens or ended by EOS.
  const auto grammar = Grammar::parse("root ::= [0-9]+");
  Engine engine(*model, *tok, {.n_parallel = 1, .n_ctx = 256, .n_threads = 2});
  for (uint64_t seed : {1, 2, 3}) {
    GenerateParams p = params(1.0f, seed);
    p.grammar = grammar;
    p.max_tokens = 8;
    const Job::Update u = engine.submit(std::move(p))->wait_all();
    ASSERT_FALSE(u.text.empty());
    EXPECT_TRUE(full_match(grammar, u.text)) << u.text;
    EXPECT_EQ(u.finish, u.logprobs.size() == 8 ? Finish::length : Finish::stop);
  }
}

TEST_F(ConstrainedTest, ImpossibleGrammarIsAnErrorNotAHang) {
  // The only token that spells what the grammar needs is banned.
  Engine engine(*model, *tok, {.n_parallel = 1, .n_ctx = 256, .n_threads = 2});
  GenerateParams p = params(0.0f, 1);
  p.grammar = Grammar::parse(R"G(root ::= "x")G");
  p.sampling.logit_bias = {{123, -100.0f}};  // "x"
  ASSERT_EQ(tok->token_to_piece(123, false), "x");
  const Job::Update u = engine.submit(std::move(p))->wait_all();
  EXPECT_EQ(u.finish, Finish::error);
  EXPECT_NE(u.error.find("no token can continue"), std::string::npos) << u.error;
}

TEST_F(ConstrainedTest, LogitBiasBansAndForces) {
  Engine engine(*model, *tok, {.n_parallel = 1, .n_ctx = 256, .n_threads = 2});
  const Job::Update plain = engine.submit(params(0.0f, 1))->wait_all();
  ASSERT_FALSE(plain.logprobs.empty());
  const int32_t first = plain.logprobs[0].id;
  GenerateParams ban = params(0.0f, 1);
  ban.sampling.logit_bias = {{first, -100.0f}};
  const Job::Update b = engine.submit(std::move(ban))->wait_all();
  for (const TokenLogprob& lp : b.logprobs) EXPECT_NE(lp.id, first);
  GenerateParams force = params(0.7f, 5);
  force.sampling.logit_bias = {{123, 100.0f}};
  force.max_tokens = 5;
  const Job::Update f = engine.submit(std::move(force))->wait_all();
  ASSERT_EQ(f.logprobs.size(), 5u);
  for (const TokenLogprob& lp : f.logprobs) EXPECT_EQ(lp.id, 123);
}

}  // namespace
}  // namespace xpert
