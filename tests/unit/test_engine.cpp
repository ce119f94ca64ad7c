// The serving engine's scheduling on the tiny qwen3 fixture: batched requests give the same greedy
// tokens as one at a time and as a plain Session; cancel frees the slot; the queue is bounded.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "runtime/engine.h"
#include "runtime/session.h"
#include "text/tokenizer.h"

namespace xpert {
namespace {

std::string fixture() {
  const char* dir = std::getenv("XPERT_SOURCE_DIR");
  return std::string(dir ? dir : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/tiny_qwen3.gguf";
}

struct EngineTest : ::testing::Test {
  void SetUp() override {
    model = Model::load(fixture());
    tok = Tokenizer::from_gguf(model->file());
  }
  // Prompts of different lengths; some longer than the prefill chunk so prefill spans steps.
  std::vector<int32_t> prompt(int i) const {
    std::vector<int32_t> p = {1};
    for (int k = 0; k < 3 + 7 * i; ++k) p.push_back(3 + (k * 37 + i * 11) % 300);
    return p;
  }
  GenerateParams greedy(int i, int64_t max_tokens = 12) const {
    GenerateParams g;
    g.prompt = prompt(i);
    g.sampling.temperature = 0;
    g.max_tokens = max_tokens;
    g.top_logprobs = 0;  // to get the token ids back
    return g;
  }
  static std::vector<int32_t> ids(const Job::Update& u) {
    std::vector<int32_t> out;
    for (const TokenLogprob& lp : u.logprobs) out.push_back(lp.id);
    return out;
  }
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
};

TEST_F(EngineTest, OneRequestEqualsSession) {
  Engine engine(*model, *tok, {.n_parallel = 2, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8});
  for (int i : {0, 3}) {
    const Job::Update u = engine.submit(greedy(i))->wait_all();
    Session s(*model, {.n_ctx = 128, .n_threads = 2, .n_batch = 8});
    std::vector<int32_t> want;
    const std::vector<float>* logits = &s.eval(prompt(i));
    for (int n = 0; n < 12; ++n) {
      const int32_t id = argmax(*logits);
      if (tok->is_eog(id)) break;
      want.push_back(id);
      logits = &s.eval(std::span<const int32_t>(&id, 1));
    }
    EXPECT_EQ(ids(u), want) << "prompt " << i;
    EXPECT_EQ(u.finish, want.size() == 12 ? Finish::length : Finish::stop);
  }
}

TEST_F(EngineTest, ConcurrentEqualsOneAtATime) {
  const int n = 7;
  std::vector<std::vector<int32_t>> alone(n);
  {
    Engine engine(*model, *tok, {.n_parallel = 1, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8});
    for (int i = 0; i < n; ++i) alone[i] = ids(engine.submit(greedy(i))->wait_all());
  }
  Engine engine(*model, *tok, {.n_parallel = 3, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8});
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < n; ++i) jobs.push_back(engine.submit(greedy(i)));
  for (int i = 0; i < n; ++i) {
    const Job::Update u = jobs[i]->wait_all();
    EXPECT_EQ(ids(u), alone[i]) << "request " << i;
    EXPECT_EQ(jobs[i]->n_generated(), (int64_t)alone[i].size());
    EXPECT_EQ(jobs[i]->n_prompt(), (int64_t)prompt(i).size());
  }
  const Engine::Stats s = engine.stats();
  EXPECT_EQ(s.busy_slots, 0);
  EXPECT_EQ(s.queue_depth, 0);
  EXPECT_GT(s.generated_tokens, 0u);
}

TEST_F(EngineTest, CancelFreesTheSlot) {
  Engine engine(*model, *tok, {.n_parallel = 1, .n_ctx = 256, .n_threads = 2, .prefill_chunk = 8});
  // A sampled request can end by itself (an end-of-generation token) before this thread gets to
  // cancel it; such a try says nothing about cancelling, so take another seed.
  bool cancelled = false;
  for (uint64_t seed = 7; seed < 27 && !cancelled; ++seed) {
    GenerateParams long_one = greedy(1, 0);  // until the context is full
    long_one.sampling.temperature = 1.0f;
    long_one.sampling.seed = seed;
    auto job = engine.submit(long_one);
    auto waiting = engine.submit(greedy(2, 4));
    Job::Update u;
    while (!job->wait(u, std::chrono::milliseconds(100)) || u.logprobs.empty()) {
    }
    if (u.finish == Finish::none) {
      job->cancel();
      const Finish f = job->wait_all().finish;
      cancelled = f == Finish::cancelled;
      if (!cancelled) {
        EXPECT_TRUE(f == Finish::stop || f == Finish::length) << finish_name(f);
      }
    }
    const Job::Update w = waiting->wait_all();  // got the slot
    EXPECT_NE(w.finish, Finish::cancelled);
    EXPECT_EQ(engine.stats().busy_slots, 0);
  }
  EXPECT_TRUE(cancelled) << "every try ended by itself before it could be cancelled";
}

TEST_F(EngineTest, ContextFullIsLength) {
  Engine engine(*model, *tok, {.n_parallel = 1, .n_ctx = 40, .n_threads = 2, .prefill_chunk = 8});
  GenerateParams g = greedy(2, 0);
  g.sampling.temperature = 1.0f;
  g.sampling.seed = 3;
  auto job = engine.submit(g);
  const Job::Update u = job->wait_all();
  if (u.finish == Finish::length)
    EXPECT_EQ(job->n_prompt() + job->n_generated(), 40);
  else
    EXPECT_EQ(u.finish, Finish::stop);
}

TEST_F(EngineTest, BoundedQueue) {
  Engine engine(*model, *tok,
                {.n_parallel = 1, .n_ctx = 256, .n_threads = 1, .prefill_chunk = 8, .max_queue = 1});
  // One slot and one queue place: of 20 submissions microseconds apart at most a few can be taken
  // (a request that ends at once, e.g. on an end-of-generation first token, frees its slot early,
  // so the exact count depends on timing); the rest must be refused.
  std::vector<std::shared_ptr<Job>> taken;
  int refused = 0;
  for (int i = 0; i < 20; ++i) {
    try {
      taken.push_back(engine.submit(greedy(3, 200)));
    } catch (const QueueFull&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GE((int)taken.size(), 2);  // the slot and the queue place
  for (auto& j : taken) j->cancel();
  for (auto& j : taken) j->wait_all();
}

TEST_F(EngineTest, RejectsBadPrompts) {
  Engine engine(*model, *tok, {.n_parallel = 1, .n_ctx = 32, .n_threads = 1});
  GenerateParams g;
  EXPECT_THROW(engine.submit(g), Error);  // empty
  g.prompt.assign(32, 5);
  EXPECT_THROW(engine.submit(g), Error);  // no room to generate
  g.prompt = {1, 100000};
  EXPECT_THROW(engine.submit(g), Error);  // token out of range
}

TEST_F(EngineTest, StopStringEndsTheText) {
  Engine engine(*model, *tok, {.n_parallel = 2, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8});
  GenerateParams g = greedy(4, 16);
  const Job::Update full = engine.submit(g)->wait_all();
  if (full.text.size() < 4) GTEST_SKIP() << "the fixture's greedy text is too short";
  g.stop = {full.text.substr(2, 2)};
  const Job::Update cut = engine.submit(g)->wait_all();
  EXPECT_EQ(cut.finish, Finish::stop);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(g.stop[0])));
}

// Prefix reuse: a request extending the previous prompt + reply prefills only the new tokens, and its
// greedy tokens equal those of a fresh engine.
TEST_F(EngineTest, ReusesPromptPlusReply) {
  const EngineOptions o{.n_parallel = 2, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8};
  Engine engine(*model, *tok, o);
  GenerateParams a = greedy(3);
  auto ja = engine.submit(a);
  const Job::Update ua = ja->wait_all();
  EXPECT_EQ(ja->n_cached(), 0);
  GenerateParams b = a;
  const std::vector<int32_t> reply = ids(ua);
  b.prompt.insert(b.prompt.end(), reply.begin(), reply.end());
  for (int k = 0; k < 5; ++k) b.prompt.push_back(7 + k * 13);
  auto jb = engine.submit(b);
  const Job::Update ub = jb->wait_all();
  // The last reply token is fed back only when generation went on past it (not at max_tokens).
  const int64_t fed = (int64_t)a.prompt.size() + (int64_t)reply.size() - (ua.finish == Finish::length ? 1 : 0);
  EXPECT_GT(jb->n_cached(), 0);
  EXPECT_EQ(jb->n_cached(), fed);
  EXPECT_GE(engine.stats().prompt_tokens_cached, (uint64_t)fed);
  Engine fresh(*model, *tok, o);
  auto jf = fresh.submit(b);
  EXPECT_EQ(ids(ub), ids(jf->wait_all()));
  EXPECT_EQ(jf->n_cached(), 0);
}

// A prompt sharing only part of a previous one reuses exactly the common prefix (from the slot that
// holds it), and still gives the tokens of a fresh engine.
TEST_F(EngineTest, ReusesTheCommonPrefix) {
  const EngineOptions o{.n_parallel = 2, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8};
  Engine engine(*model, *tok, o);
  engine.submit(greedy(1))->wait_all();  // shares only token 0 with the prompts below
  engine.submit(greedy(3))->wait_all();
  GenerateParams b = greedy(3);
  b.prompt.resize(10);
  for (int k = 0; k < 9; ++k) b.prompt.push_back(310 + k);  // differs from prompt(3) at position 10
  ASSERT_NE(b.prompt[10], prompt(3)[10]);
  auto jb = engine.submit(b);
  const Job::Update ub = jb->wait_all();
  EXPECT_EQ(jb->n_cached(), 10);
  // The same prompt again: everything but the last token is reused.
  auto jc = engine.submit(b);
  EXPECT_EQ(ids(jc->wait_all()), ids(ub));
  EXPECT_EQ(jc->n_cached(), (int64_t)b.prompt.size() - 1);
  Engine fresh(*model, *tok, o);
  EXPECT_EQ(ids(fresh.submit(b)->wait_all()), ids(ub));
}

}  // namespace
}  // namespace xpert

namespace xpert {
namespace {

// Hybrid models never reuse a prefix (the recurrent state cannot be rolled back) and stay correct.
TEST_F(EngineTest, HybridModelNeverReuses) {
  const char* dir = std::getenv("XPERT_SOURCE_DIR");
  model = Model::load(std::string(dir ? dir : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/tiny_qwen35moe.gguf");
  tok = Tokenizer::from_gguf(model->file());
  const EngineOptions o{.n_parallel = 1, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8};
  Engine engine(*model, *tok, o);
  GenerateParams a = greedy(2);
  const Job::Update ua = engine.submit(a)->wait_all();
  GenerateParams b = a;
  const std::vector<int32_t> reply = ids(ua);
  b.prompt.insert(b.prompt.end(), reply.begin(), reply.end());
  b.prompt.push_back(42);
  auto jb = engine.submit(b);
  const Job::Update ub = jb->wait_all();
  EXPECT_EQ(jb->n_cached(), 0);
  auto ja2 = engine.submit(a);  // the identical prompt again
  EXPECT_EQ(ids(ja2->wait_all()), reply);
  EXPECT_EQ(ja2->n_cached(), 0);
  EXPECT_EQ(engine.stats().prompt_tokens_cached, 0u);
  Engine fresh(*model, *tok, o);
  EXPECT_EQ(ids(fresh.submit(b)->wait_all()), ids(ub));
}

// A hybrid model (Gated DeltaNet + attention): each slot carries its own recurrent state, and a slot
// reused by a new request starts from a clean one.
TEST_F(EngineTest, HybridModelConcurrentEqualsOneAtATime) {
  const char* dir = std::getenv("XPERT_SOURCE_DIR");
  model = Model::load(std::string(dir ? dir : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/tiny_qwen35moe.gguf");
  tok = Tokenizer::from_gguf(model->file());
  const int n = 5;
  std::vector<std::vector<int32_t>> alone(n);
  {
    Engine engine(*model, *tok, {.n_parallel = 1, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8});
    for (int i = 0; i < n; ++i) alone[i] = ids(engine.submit(greedy(i))->wait_all());
  }
  Engine engine(*model, *tok, {.n_parallel = 2, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8});
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < n; ++i) jobs.push_back(engine.submit(greedy(i)));
  for (int i = 0; i < n; ++i) {
    const Job::Update u = jobs[i]->wait_all();
    EXPECT_FALSE(ids(u).empty()) << "request " << i << ": " << u.error;
    EXPECT_EQ(ids(u), alone[i]) << "request " << i;
  }
}

}  // namespace
}  // namespace xpert
