// The serving engine: one thread owns the model and runs continuous batching over `n_parallel` cache
// slots. Callers (HTTP threads, tests) submit a tokenized request and get a Job, a thread-safe channel
// that delivers text as it is generated; cancelling a Job frees its slot at the next step.
//
// Prefix reuse (see runtime/state_cache.h and docs/ARCHITECTURE.md, "State cache"): a slot keeps its
// KV rows (and, for hybrid models, its recurrent state) after a request ends. A new request resumes
// from the longest prefix of its prompt found either in a free slot's own rows or in the host-RAM
// StateCache, and evaluates only the rest. Before a slot's rows are overwritten by another
// conversation they are saved to the StateCache, so nothing is lost but by LRU eviction within
// --cache-ram. Hybrid models resume only at checkpoints of the recurrent state, taken at the end of
// each prompt (its last token excluded, so an identical prompt resumes too), where a prompt leaves the
// cached paths, every `checkpoint_every` tokens, and when a slot's content is saved.
//
// Each step builds one batch under a token budget (EngineOptions::batch_tokens): the next token of every
// generating slot always goes in, and prompt chunks fill the rest, shared fairly among the prefilling
// slots (each gets an equal share, at most prefill_chunk; what a short prompt leaves goes to the others),
// so neither the running streams nor a short prompt wait behind a long one. One Model::forward per step,
// with one BatchSegment per slot. Time to first token and between tokens are kept for /metrics.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "model/model.h"
#include "runtime/experts/routing_stats.h"
#include "model/kv_cache.h"
#include "runtime/latency.h"
#include "runtime/pinned_floats.h"
#include "model/recurrent_state.h"
#include "runtime/state_cache.h"
#include "sample/constrained.h"
#include "sample/sampler.h"

namespace xpert {

class Tokenizer;
class ExpertRebalancer;

struct EngineOptions {
  int n_parallel = 4;           // cache slots = sequences generated at once
  int64_t n_ctx = 4096;         // per slot; 0: the model's trained context
  int n_threads = 0;            // 0: physical cores
  int64_t prefill_chunk = 128;  // prompt tokens of one slot per step, at most
  // Tokens of one step, at most: every generating slot's next token, then prompt chunks up to the rest
  // (at least one prompt token a step while a prompt waits). 0: n_parallel + prefill_chunk.
  int64_t batch_tokens = 0;
  int max_queue = 64;           // requests waiting for a slot; past it submit() throws QueueFull
  // Host-RAM state cache (0: off; slots still reuse their own rows), and for hybrid models a checkpoint
  // every this many positions (0: only at prompt ends and when a slot is saved).
  size_t cache_ram_bytes = size_t{1} << 30;
  int64_t checkpoint_every = 1024;
  KvTypes cache_types = {};  // --cache-type-k / --cache-type-v
  // MoE models with split GPU layers (--rebalance-experts): called on the engine thread after every
  // forward pass, between passes, to move experts toward the routing counted while serving. Not owned.
  ExpertRebalancer* rebalancer = nullptr;
};

struct GenerateParams {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_tokens = 0;         // 0: until end of generation or the slot's context is full
  std::vector<std::string> stop;  // stop strings (not part of the output)
  int top_logprobs = -1;          // < 0: no logprobs; else report this many alternatives per token
  // Constrained decoding (sample/grammar.h): every token keeps the output a prefix of a sentence of the
  // grammar; end of generation only once it is complete, and generation stops when nothing may follow.
  // Null: free text. Build one with Grammar::parse(gbnf) or json_schema_to_grammar (sample/json_schema.h).
  std::shared_ptr<const Grammar> grammar;
  // Non-empty: the grammar starts after this text in the output (GrammarSampler's lazy start), so a
  // thinking model reasons freely and only its answer after "</think>" is constrained.
  std::string grammar_after;
  bool ignore_eos = false;  // end-of-generation tokens are ordinary tokens (benchmarks: exactly max_tokens)
};

struct TokenLogprob {
  int32_t id = 0;
  std::string piece;  // raw bytes of the token (may be a partial UTF-8 character)
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // the best alternatives: piece, logprob
};

enum class Finish { none, stop, length, cancelled, error };

// How an embedding is made of a prompt's hidden states (after the final norm): their mean, the last
// token's, or the first token's (BERT's CLS position).
enum class Pooling { mean, last, cls };
const char* pooling_name(Pooling p);
const char* finish_name(Finish f);  // "stop", "length", ...

// The channel of one request. The engine appends; the consumer takes what has arrived.
class Job {
 public:
  struct Update {
    std::string text;
    std::vector<TokenLogprob> logprobs;
    Finish finish = Finish::none;  // set in the last update
    std::string error;
    int stop_index = -1;  // finish == stop on a stop string: its index in GenerateParams::stop
  };
  // Waits up to `timeout` for output; moves everything new into `out` (replacing it). False when nothing
  // new arrived in time.
  bool wait(Update& out, std::chrono::milliseconds timeout);
  // Blocks until the end; everything concatenated.
  Update wait_all();
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  int64_t n_prompt() const { return n_prompt_; }
  int64_t n_generated() const { return n_generated_.load(); }
  // Prompt tokens not evaluated because their state was cached (set at admission): OpenAI's
  // usage.prompt_tokens_details.cached_tokens.
  int64_t n_cached() const { return n_cached_.load(); }
  // Seconds from submit() to the first sampled token; < 0 before it.
  double ttft_seconds() const { return ttft_.load(); }

 private:
  friend class Engine;
  void push(std::string text, TokenLogprob* lp);
  void finish(Finish f, std::string error = {}, int stop_index = -1);

  GenerateParams params_;
  int64_t n_prompt_ = 0;
  std::atomic<int64_t> n_generated_{0};
  std::atomic<int64_t> n_cached_{0};
  std::atomic<double> ttft_{-1.0};
  std::chrono::steady_clock::time_point submitted_, last_token_;  // last_token_: engine thread only
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  Update pending_;
  bool has_news_ = false, done_ = false;
};

// The scheduler's fairness: `left` prompt tokens shared among prefilling slots that want want[i] each
// (oldest first), max-min fair: the smallest wants are met first, the rest split evenly, the remainder of
// the division to the oldest. Returns what each gets (sums to min(left, sum of wants)).
std::vector<int64_t> share_prefill_budget(const std::vector<int64_t>& want, int64_t left);

// submit() when every slot is busy and the queue is full.
class QueueFull : public Error {
 public:
  using Error::Error;
};

class Engine {
 public:
  Engine(const Model& model, const Tokenizer& tokenizer, const EngineOptions& opts);
  ~Engine();  // finishes every job with an error and joins the engine thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Throws Error for an empty prompt or one that does not fit a slot's context, QueueFull past capacity.
  std::shared_ptr<Job> submit(GenerateParams params);

  // The embedding of `tokens`: their final-normed hidden states pooled and L2-normalised. Runs on the
  // engine thread between batching steps, prefilled in chunks on a cache slot of its own (made at the
  // first call, so serving chat costs no memory for it). Blocks until done; throws Error for an empty
  // prompt, one longer than a slot's context, or out-of-range ids.
  std::vector<float> embed(std::vector<int32_t> tokens, Pooling pooling);

  // Each prompt token's log-probability after the tokens before it, with the top_n best alternatives
  // (completions' echo with logprobs); element 0 (the first token, with nothing before it) holds only
  // its id and piece. Runs like embed(), on its slot, in chunks of 32 rows (all rows' logits).
  std::vector<TokenLogprob> prompt_logprobs(std::vector<int32_t> tokens, int top_n);

  int64_t n_ctx() const { return cache_.n_ctx(); }
  int n_parallel() const { return opts_.n_parallel; }

  struct Stats {
    int busy_slots = 0, queue_depth = 0;
    uint64_t prompt_tokens = 0, generated_tokens = 0, steps = 0;  // prompt_tokens: evaluated
    uint64_t prompt_tokens_cached = 0;  // prompt tokens resumed from cached state, not evaluated
    uint64_t prompt_tokens_total = 0;   // of admitted requests (cached + to evaluate)
    // Hybrid models: requests that resumed from a checkpoint (a slot's live state or the StateCache) /
    // had to start at position 0; checkpoints saved to the StateCache.
    uint64_t checkpoint_hits = 0, checkpoint_misses = 0, checkpoints_stored = 0;
    StateCacheStats cache;
    double forward_seconds = 0;
    double tokens_per_second = 0;  // generated tokens over the last 10 s
    // MoE models: tokens whose routing was counted (the most-counted layer), and the share of routings
    // the most routed quarter of each layer's experts took, averaged over the layers (0.25: flat).
    uint64_t routed_tokens = 0;
    double top_quarter_share = 0;
    // --rebalance-experts: rounds run and experts moved between the GPU and the host.
    uint64_t rebalance_rounds = 0, expert_moves = 0;
    // Latency over the last 4096 requests (time to first token: submit() to the first sampled token,
    // queueing included) and the last 65536 tokens (the time between a request's consecutive tokens),
    // in seconds; 0 with no sample.
    double ttft_p50 = 0, ttft_p90 = 0, itl_p50 = 0, itl_p90 = 0;
    uint64_t ttft_count = 0, itl_count = 0;  // samples ever taken
    double ttft_sum = 0, itl_sum = 0;        // of all of them
  };
  Stats stats() const;
  void clear_latency();  // forgets the latency samples (a benchmark's warm-up)
  // MoE models: how often each layer routed to each expert while serving (layers whose experts the
  // host or a split GPU layer computes; a layer wholly on the GPU routes there and is not counted).
  // Null for dense models. A profile (`--expert-profile`) is a saved copy.
  const RoutingStats* routing() const { return routing_.get(); }

 private:
  struct Slot;
  void loop();
  void admit(std::shared_ptr<Job> job);
  int64_t step(std::vector<Slot*>& active);  // returns the tokens forwarded
  std::vector<int64_t> prefill_shares(const std::vector<Slot*>& waiting, int64_t n_decode) const;  // of the budget
  struct Pick {
    int32_t id = -1;
    std::string error;  // a grammar error: the request ends with it
  };
  Pick pick(Slot& s, std::span<const float> logits);  // the slot's next token; touches only the slot
  void emit(Slot& s, const Pick& k, std::span<const float> logits);  // feeds it back, streams it, or ends
  void release(Slot& s, Finish f, std::string error = {}, int stop_index = -1);
  void save_slot(Slot& s);
  int64_t next_checkpoint(const Slot& s) const;
  void maybe_store(Slot& s);
  void publish_cache_stats();
  std::vector<float> embed_now(const std::vector<int32_t>& tokens, Pooling pooling);
  std::vector<TokenLogprob> prompt_logprobs_now(const std::vector<int32_t>& tokens, int top_n);
  void check_input(const std::vector<int32_t>& tokens) const;

  const Model& model_;
  const Tokenizer& tok_;
  EngineOptions opts_;
  ThreadPool pool_;
  KvCache cache_;
  std::unique_ptr<RecurrentState> state_;  // hybrid models: one recurrent state per slot
  StateCache state_cache_;                 // touched by the engine thread only
  std::unique_ptr<RoutingStats> routing_;  // MoE models: counted by every forward pass
  std::vector<std::unique_ptr<Slot>> slots_;
  ExpertRebalancer* rebalancer_ = nullptr;  // null when off, or after a round failed

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  struct EmbedTask;
  std::deque<std::unique_ptr<EmbedTask>> tasks_;  // embed(): run on the engine thread between steps
  std::unique_ptr<KvCache> embed_cache_;      // embed()'s own slot (engine thread)
  std::unique_ptr<RecurrentState> embed_state_;
  bool stop_ = false;
  uint64_t admitted_ = 0;

  std::atomic<int> busy_{0};
  std::atomic<uint64_t> prompt_tokens_{0}, generated_tokens_{0}, steps_{0}, cached_tokens_{0},
      prompt_total_{0};
  std::atomic<uint64_t> checkpoint_hits_{0}, checkpoint_misses_{0};
  StateCacheStats cache_stats_;  // under mu_: a copy for stats()
  std::atomic<double> forward_seconds_{0};
  std::deque<std::pair<std::chrono::steady_clock::time_point, int>> recent_;  // under mu_
  LatencyWindow ttft_{4096}, itl_{65536};                                     // under mu_
  std::unique_ptr<TokenTrie> trie_;  // the vocabulary's pieces, built for the first grammar request
  // Mask tables by grammar text, shared by requests with the same grammar (engine thread only).
  std::unordered_map<std::string, std::shared_ptr<GrammarTables>> grammar_tables_;
  PinnedFloats logits_;  // registered with the model's offload device, where it does that
  std::thread thread_;
};

}  // namespace xpert
