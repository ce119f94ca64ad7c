// The serving engine's scheduling on the tiny qwen3 fixture: batched requests give the same greedy
// tokens as one at a time and as a plain Session; cancel frees the slot; the queue is bounded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "model/kv_cache.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "text/builtin_templates.h"
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

// Several prompts prefilled in one step (a budget of more than one chunk): still the tokens of one at a time.
TEST_F(EngineTest, SharedPrefillStepsEqualOneAtATime) {
  const int n = 6;
  std::vector<std::vector<int32_t>> alone(n);
  {
    Engine engine(*model, *tok, {.n_parallel = 1, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8});
    for (int i = 0; i < n; ++i) alone[i] = ids(engine.submit(greedy(i))->wait_all());
  }
  Engine engine(*model, *tok,
                {.n_parallel = 4, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8, .batch_tokens = 23});
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < n; ++i) jobs.push_back(engine.submit(greedy(i)));
  for (int i = 0; i < n; ++i) EXPECT_EQ(ids(jobs[i]->wait_all()), alone[i]) << "request " << i;
  const Engine::Stats s = engine.stats();
  EXPECT_EQ(s.ttft_count, (uint64_t)n);  // a time to first token per request, one between each next token
  uint64_t tokens = 0;
  for (int i = 0; i < n; ++i) tokens += alone[i].size();
  EXPECT_EQ(s.itl_count, tokens - n);
  EXPECT_GT(s.ttft_p90, 0.0);
  EXPECT_GE(s.ttft_p90, s.ttft_p50);
  EXPECT_GE(s.itl_p90, s.itl_p50);
  engine.clear_latency();
  EXPECT_EQ(engine.stats().ttft_p50, 0.0);
}

TEST(PrefillBudget, SharedMaxMinFairly) {
  // Wants of the prefilling slots, oldest first, and the tokens left in the step.
  EXPECT_EQ(share_prefill_budget({16, 16, 4}, 20), (std::vector<int64_t>{8, 8, 4}));
  EXPECT_EQ(share_prefill_budget({16, 4}, 20), (std::vector<int64_t>{16, 4}));
  EXPECT_EQ(share_prefill_budget({16, 4}, 100), (std::vector<int64_t>{16, 4}));
  EXPECT_EQ(share_prefill_budget({16, 16, 16}, 20), (std::vector<int64_t>{7, 7, 6}));  // remainder: oldest
  EXPECT_EQ(share_prefill_budget({16, 16, 16}, 1), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(share_prefill_budget({}, 5), (std::vector<int64_t>{}));
}

// A long prompt admitted first does not hold back a short one admitted with it: the short one's prefill
// shares the first steps, so its first token comes before the long one's.
TEST_F(EngineTest, ShortPromptIsNotStalledByALongOne) {
  Engine engine(*model, *tok,
                {.n_parallel = 2, .n_ctx = 256, .n_threads = 2, .prefill_chunk = 4, .batch_tokens = 8});
  GenerateParams longer = greedy(0, 2);
  longer.prompt.clear();
  for (int k = 0; k < 200; ++k) longer.prompt.push_back(3 + (k * 13) % 300);
  auto slow = engine.submit(longer);
  auto quick = engine.submit(greedy(0, 2));
  quick->wait_all();
  slow->wait_all();
  ASSERT_GE(quick->ttft_seconds(), 0.0);
  EXPECT_LT(quick->ttft_seconds(), slow->ttft_seconds());
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
  if (u.finish == Finish::length)  // every position holds a token, and one more was generated
    EXPECT_EQ(job->n_prompt() + job->n_generated(), 41);
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

// --- the state cache (runtime/state_cache.h) -------------------------------------------------------
//
// A conversation in token space: each turn's prompt is the previous prompt, the reply, a few "template"
// tokens and the new message. The slot holds the prompt and every reply token fed back (all but the
// last when generation stopped at max_tokens), so a turn resumes exactly there and evaluates the rest.
// "Cache off" is a fresh engine with --cache-ram 0 per request. Prefill runs one token per step in the
// comparisons so the arithmetic of every position is the same either way and tokens must match exactly
// (with larger chunks a resumed prefix changes the float summation order, as -b does).

namespace xpert {
namespace {

std::string fixture_file(const char* name) {
  const char* dir = std::getenv("XPERT_SOURCE_DIR");
  return std::string(dir ? dir : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/" + name;
}

struct Turn {
  std::vector<int32_t> reply;  // generated ids
  int64_t n_fed = 0;           // of them, fed back into the slot
  int64_t n_cached = 0, n_evaluated = 0;
  Finish finish = Finish::none;
};

struct StateCacheTest : EngineTest {
  // One request; n_evaluated from the engine's counter (requests run one at a time here).
  Turn run(Engine& e, const GenerateParams& g) {
    const uint64_t before = e.stats().prompt_tokens;
    auto job = e.submit(g);
    const Job::Update u = job->wait_all();
    Turn t;
    t.reply = ids(u);
    t.finish = u.finish;
    t.n_fed = (int64_t)t.reply.size() - (u.finish == Finish::length ? 1 : 0);
    t.n_cached = job->n_cached();
    t.n_evaluated = (int64_t)(e.stats().prompt_tokens - before);
    return t;
  }
  // The same request on a fresh engine with no state cache.
  std::vector<int32_t> cache_off(const GenerateParams& g, int64_t n_ctx) {
    Engine e(*model, *tok,
             {.n_parallel = 1, .n_ctx = n_ctx, .n_threads = 2, .prefill_chunk = 1, .cache_ram_bytes = 0});
    return run(e, g).reply;
  }
  static std::vector<int32_t> next_prompt(const std::vector<int32_t>& prompt, const Turn& t, int turn,
                                          int conv) {
    std::vector<int32_t> p = prompt;
    p.insert(p.end(), t.reply.begin(), t.reply.end());
    for (int32_t x : {5, 6, 7}) p.push_back(x);  // the template's tail and the next turn's header
    for (int k = 0; k < 4 + turn; ++k) p.push_back(20 + (k * 31 + turn * 7 + conv * 13) % 250);
    return p;
  }
  int64_t prev_fed_ = 0;
  void load(const char* name) {
    model = Model::load(fixture_file(name));
    tok = Tokenizer::from_gguf(model->file());
  }
};

// Five turns on one slot: each turn evaluates exactly the tokens after what the slot holds.
TEST_F(StateCacheTest, HybridFiveTurnChatEvaluatesOnlyTheNewTokens) {
  load("tiny_qwen35moe.gguf");
  const int64_t n_ctx = 256;
  Engine e(*model, *tok,
           {.n_parallel = 1, .n_ctx = n_ctx, .n_threads = 2, .prefill_chunk = 1, .checkpoint_every = 16});
  GenerateParams g = greedy(2, 6);
  std::vector<int32_t> prev_prompt;
  Turn prev;
  for (int turn = 0; turn < 5; ++turn) {
    const Turn t = run(e, g);
    ASSERT_FALSE(t.reply.empty()) << "turn " << turn;
    EXPECT_EQ(t.n_evaluated, (int64_t)g.prompt.size() - t.n_cached) << "turn " << turn;
    EXPECT_EQ(t.reply, cache_off(g, n_ctx)) << "turn " << turn;
    EXPECT_EQ(t.n_cached, turn == 0 ? 0 : (int64_t)prev_prompt.size() + prev.n_fed) << "turn " << turn;
    prev = t;
    prev_prompt = g.prompt;
    g.prompt = next_prompt(g.prompt, t, turn, 0);
  }
  const Engine::Stats s = e.stats();
  EXPECT_EQ(s.checkpoint_hits, 4u);
  EXPECT_EQ(s.checkpoint_misses, 1u);
  EXPECT_GT(s.checkpoints_stored, 0u);
  EXPECT_EQ(s.prompt_tokens + s.prompt_tokens_cached, s.prompt_tokens_total);
}

// Three conversations take turns on one slot: each resumes from its own checkpoint, saved when another
// conversation took the slot.
void interleaved(StateCacheTest& test, bool hybrid) {
  const int64_t n_ctx = 256;
  Engine e(*test.model, *test.tok,
           {.n_parallel = 1, .n_ctx = n_ctx, .n_threads = 2, .prefill_chunk = 1, .checkpoint_every = 0});
  std::vector<GenerateParams> g = {test.greedy(1, 5), test.greedy(2, 5), test.greedy(3, 5)};
  std::vector<std::vector<int32_t>> prev_prompt(3);
  std::vector<Turn> prev(3);
  for (int turn = 0; turn < 3; ++turn)
    for (int c = 0; c < 3; ++c) {
      const Turn t = test.run(e, g[c]);
      ASSERT_FALSE(t.reply.empty());
      const int64_t want = turn == 0 ? (hybrid || c == 0 ? 0 : 1)  // dense: the first token is shared
                                     : (int64_t)prev_prompt[c].size() + prev[c].n_fed;
      EXPECT_EQ(t.n_cached, want) << "conversation " << c << " turn " << turn;
      EXPECT_EQ(t.n_evaluated, (int64_t)g[c].prompt.size() - t.n_cached);
      EXPECT_EQ(t.reply, test.cache_off(g[c], n_ctx)) << "conversation " << c << " turn " << turn;
      prev[c] = t;
      prev_prompt[c] = g[c].prompt;
      g[c].prompt = StateCacheTest::next_prompt(g[c].prompt, t, turn, c);
    }
  const Engine::Stats s = e.stats();
  if (hybrid) {
    EXPECT_EQ(s.checkpoint_hits, 6u);
    EXPECT_EQ(s.checkpoint_misses, 3u);
  }
  EXPECT_GT(s.cache.n_tokens, 0);
  EXPECT_LE(s.cache.bytes, s.cache.budget_bytes);
}

TEST_F(StateCacheTest, HybridInterleavedConversationsResumeFromTheirOwnCheckpoints) {
  load("tiny_qwen35moe.gguf");
  interleaved(*this, true);
}

TEST_F(StateCacheTest, DenseInterleavedConversationsResumeFromTheirOwnRows) { interleaved(*this, false); }

// An identical prompt resumes from the checkpoint before its last token; a prompt sharing a long prefix
// with a cached one makes a checkpoint where they part, for the next one sharing it.
TEST_F(StateCacheTest, HybridRepeatsAndBranches) {
  load("tiny_qwen35.gguf");
  Engine e(*model, *tok,
           {.n_parallel = 1, .n_ctx = 256, .n_threads = 2, .prefill_chunk = 8, .checkpoint_every = 0});
  GenerateParams a = greedy(9, 4);  // 66 tokens
  EXPECT_EQ(run(e, a).n_cached, 0);
  EXPECT_EQ(run(e, a).n_cached, (int64_t)a.prompt.size() - 1);
  GenerateParams b = a, c = a;
  b.prompt.resize(50);
  c.prompt.resize(50);
  for (int k = 0; k < 10; ++k) b.prompt.push_back(300 + k), c.prompt.push_back(340 + k);
  EXPECT_EQ(run(e, b).n_cached, 0);   // no checkpoint inside the shared 50 tokens yet
  EXPECT_EQ(run(e, c).n_cached, 50);  // b made one where it left a's path
  EXPECT_EQ(e.stats().checkpoint_misses, 2u);
}

// A conversation that fills the context: the request that reaches it ends with "length"; the next turn
// does not fit and is refused with a clear error; the engine keeps serving, and from the cache.
TEST_F(StateCacheTest, HybridConversationThatFillsTheContext) {
  load("tiny_qwen35moe.gguf");
  const int64_t n_ctx = 64;
  Engine e(*model, *tok,
           {.n_parallel = 1, .n_ctx = n_ctx, .n_threads = 2, .prefill_chunk = 4, .checkpoint_every = 16});
  GenerateParams other = greedy(0, 4);
  const Turn o1 = run(e, other);
  GenerateParams a = greedy(2, 0);  // until the end of generation or of the context
  Turn t;
  int turn = 0;
  for (;; ++turn) {
    ASSERT_LT(turn, 20) << "the context never filled";
    t = run(e, a);
    if (t.finish == Finish::length) break;
    a.prompt = next_prompt(a.prompt, t, turn, 1);
  }
  // Every position holds a token; the last one generated had no room to be fed back.
  EXPECT_EQ((int64_t)a.prompt.size() + (int64_t)t.reply.size(), n_ctx + 1);
  GenerateParams too_long = a;
  too_long.prompt = next_prompt(a.prompt, t, turn, 1);
  EXPECT_THROW(e.submit(too_long), Error);
  // The other conversation resumes where it was; the last prompt that fitted resumes before its end.
  GenerateParams o2 = other;
  o2.prompt = next_prompt(other.prompt, o1, 0, 2);
  EXPECT_EQ(run(e, o2).n_cached, (int64_t)other.prompt.size() + o1.n_fed);
  a.max_tokens = 2;
  EXPECT_EQ(run(e, a).n_cached, (int64_t)a.prompt.size() - 1);
}

// A budget smaller than the conversations: LRU eviction, never over budget, output unchanged.
TEST_F(StateCacheTest, HybridSmallBudgetStillCorrect) {
  load("tiny_qwen35moe.gguf");
  size_t ckpt = 0;
  {
    Engine probe(*model, *tok, {.n_parallel = 1, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8});
    run(probe, greedy(1, 2));
    ckpt = probe.stats().cache.bytes;  // one checkpoint and its rows, about
  }
  Engine e(*model, *tok,
           {.n_parallel = 1, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 1, .cache_ram_bytes = 3 * ckpt});
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < 4; ++i) {
      const GenerateParams g = greedy(i, 3);
      EXPECT_EQ(run(e, g).reply, cache_off(g, 128));
      EXPECT_LE(e.stats().cache.bytes, 3 * ckpt);
    }
  EXPECT_GT(e.stats().cache.evictions, 0u);
}

// Session::truncate on a hybrid model goes back to the nearest checkpoint and continues exactly as a
// fresh session evaluating the same tokens would.
TEST_F(StateCacheTest, HybridSessionTruncateUsesCheckpoints) {
  load("tiny_qwen35.gguf");
  const SessionOptions so{
      .n_ctx = 128, .n_threads = 2, .n_batch = 1, .cache_ram_bytes = 1 << 20, .checkpoint_every = 0};
  Session s(*model, so);
  const std::vector<int32_t> p = prompt(3);
  const int64_t n = (int64_t)p.size();
  s.eval(p);
  s.checkpoint();
  const std::vector<int32_t> more = {40, 41, 42, 43, 44, 45};
  s.eval(more);
  EXPECT_EQ(s.truncate(n + 3), n);  // back to the checkpoint
  std::vector<int32_t> q = p;
  for (int32_t x : {50, 51, 52, 53}) q.push_back(x);
  const std::vector<float> resumed = s.eval(std::span(q).subspan(n));
  Session fresh(*model, so);
  EXPECT_EQ(fresh.eval(q), resumed);
  EXPECT_EQ(s.truncate(10), 0);  // nothing below: start over, and say so
  EXPECT_EQ(s.n_past(), 0);

  SessionOptions no_cache = so;
  no_cache.cache_ram_bytes = 0;
  Session off(*model, no_cache);
  off.eval(p);
  off.checkpoint();
  off.eval(more);
  EXPECT_EQ(off.truncate(n + 3), 0);
}

// The small test model (Gemma 3 270M) with its chat template: five turns, each rendered and tokenized as the
// server does. A turn resumes after the longest common prefix of what the slot holds (the previous
// prompt and the reply tokens fed back) and the new prompt: the whole previous prompt and, as far as
// the template renders it back to the same tokens, the reply. The last turn's tokens equal those of a
// fresh engine without the cache (only the last: one token per step on this model takes a while).
TEST_F(StateCacheTest, DefaultModelFiveTurnChat) {
  const char* dir = std::getenv("XPERT_SOURCE_DIR");
  const std::string path = std::string(dir ? dir : XPERT_SOURCE_DIR) + "/models/gemma3-270m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no models/gemma3-270m.gguf (run scripts/setup.sh)";
  model = Model::load(path);
  tok = Tokenizer::from_gguf(model->file());
  const ChatTemplate tmpl = chat_template_for(model->file());
  auto tokenize = [&](const nlohmann::ordered_json& messages) {
    ChatRenderOptions o;
    o.add_generation_prompt = true;
    std::vector<int32_t> ids = tok->encode(tmpl.render(messages, o), false, true);
    if (ids.empty() || ids.front() != tok->bos()) ids.insert(ids.begin(), tok->bos());
    return ids;
  };
  const int64_t n_ctx = 512;
  Engine e(*model, *tok, {.n_parallel = 1, .n_ctx = n_ctx, .n_threads = 2, .prefill_chunk = 1});
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::vector<int32_t> held;  // what the slot holds after a turn
  int64_t n_reply_reused = 0;
  for (const char* user : {"Hi! Answer briefly.", "What is the capital of France?", "And of Italy?",
                           "Name a color.", "Thanks!"}) {
    messages.push_back({{"role", "user"}, {"content", user}});
    GenerateParams g;
    g.prompt = tokenize(messages);
    g.sampling.temperature = 0;
    g.max_tokens = 6;
    g.top_logprobs = 0;
    int64_t want = 0;
    while (want < (int64_t)held.size() && want + 1 < (int64_t)g.prompt.size() && held[want] == g.prompt[want])
      ++want;
    const int64_t n_prev_prompt = held.empty() ? 0 : (int64_t)held.size() - prev_fed_;
    EXPECT_GE(want, n_prev_prompt) << user;  // the whole previous prompt at least
    n_reply_reused += want - n_prev_prompt;
    auto job = e.submit(g);
    const Job::Update u = job->wait_all();
    EXPECT_EQ(job->n_cached(), want) << user;
    if (messages.size() == 9) {  // the last turn only (time)
      EXPECT_EQ(ids(u), cache_off(g, n_ctx)) << user;
    }
    const std::vector<int32_t> reply = ids(u);
    prev_fed_ = (int64_t)reply.size() - (u.finish == Finish::length ? 1 : 0);
    held = g.prompt;
    held.insert(held.end(), reply.begin(), reply.begin() + prev_fed_);
    messages.push_back({{"role", "assistant"}, {"content", u.text}});
  }
  EXPECT_GT(n_reply_reused, 0);  // replies come back as the same tokens (here, at least some)
  const Engine::Stats s = e.stats();
  EXPECT_EQ(s.prompt_tokens + s.prompt_tokens_cached, s.prompt_tokens_total);
}

TEST_F(StateCacheTest, DenseSessionTruncateKeepsExactly) {
  Session s(*model, {.n_ctx = 128, .n_threads = 2, .n_batch = 8});
  s.eval(prompt(3));
  EXPECT_EQ(s.truncate(11), 11);
  EXPECT_EQ(s.n_past(), 11);
}

// Embeddings: the engine's chunked pass on its own slot, pooled and normalised, equals a plain reference
// (one forward over the whole prompt with every row's final hidden state, pooled here), for each pooling;
// and generating around it is undisturbed.
TEST_F(EngineTest, EmbedEqualsPlainPooling) {
  Engine engine(*model, *tok, {.n_parallel = 1, .n_ctx = 128, .n_threads = 2, .prefill_chunk = 8});
  const std::vector<int32_t> p = prompt(3);  // 25 tokens: four chunks of 8
  const int64_t E = model->config().n_embd, n = (int64_t)p.size();
  KvCache cache(model->config(), 128, 1);
  ThreadPool pool(2);
  std::vector<float> hidden, logits;
  model->forward({.tokens = p, .cache = &cache, .all_logits = true, .hidden = &hidden}, logits, pool);
  ASSERT_EQ((int64_t)hidden.size(), n * E);
  EXPECT_TRUE(logits.empty());
  auto normalized = [](std::vector<double> v) {
    double s = 0;
    for (double x : v) s += x * x;
    for (double& x : v) x /= std::sqrt(s);
    return v;
  };
  std::vector<double> mean(E, 0.0), first(E), last(E);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < E; ++i) mean[i] += hidden[r * E + i] / (double)n;
  for (int64_t i = 0; i < E; ++i) first[i] = hidden[i], last[i] = hidden[(n - 1) * E + i];
  const Job::Update before = engine.submit(greedy(1))->wait_all();
  for (auto [pooling, want] : {std::pair{Pooling::mean, normalized(mean)}, std::pair{Pooling::cls, normalized(first)},
                               std::pair{Pooling::last, normalized(last)}}) {
    const std::vector<float> got = engine.embed(p, pooling);
    ASSERT_EQ((int64_t)got.size(), E);
    for (int64_t i = 0; i < E; ++i) EXPECT_NEAR(got[i], want[i], 2e-4) << pooling_name(pooling) << " " << i;
  }
  EXPECT_EQ(ids(engine.submit(greedy(1))->wait_all()), ids(before));
  EXPECT_THROW(engine.embed({}, Pooling::mean), Error);
  EXPECT_THROW(engine.embed({1, 1 << 30}, Pooling::mean), Error);
}

}  // namespace
}  // namespace xpert
