#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <future>

#include "base/log.h"
#include "runtime/experts/rebalancer.h"
#include "text/tokenizer.h"
#include "text/utf8_stream.h"

namespace xpert {

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::stop:
      return "stop";
    case Finish::length:
      return "length";
    case Finish::cancelled:
      return "cancelled";
    case Finish::error:
      return "error";
    case Finish::none:
      break;
  }
  return "none";
}

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::mean:
      return "mean";
    case Pooling::last:
      return "last";
    case Pooling::cls:
      return "cls";
  }
  return "mean";
}

// --- Job -------------------------------------------------------------------------------------------

bool Job::wait(Update& out, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return has_news_; })) return false;
  out = std::move(pending_);
  pending_ = Update{};
  has_news_ = false;
  return true;
}

Job::Update Job::wait_all() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return done_; });
  Update out = std::move(pending_);
  pending_ = Update{};
  has_news_ = false;
  return out;
}

void Job::push(std::string text, TokenLogprob* lp) {
  if (text.empty() && !lp) return;
  std::lock_guard lk(mu_);
  pending_.text += text;
  if (lp) pending_.logprobs.push_back(std::move(*lp));
  has_news_ = true;
  cv_.notify_all();
}

void Job::finish(Finish f, std::string error, int stop_index) {
  std::lock_guard lk(mu_);
  if (done_) return;
  pending_.finish = f;
  pending_.error = std::move(error);
  pending_.stop_index = stop_index;
  done_ = has_news_ = true;
  cv_.notify_all();
}

// --- Engine ----------------------------------------------------------------------------------------

struct Engine::EmbedTask {  // work on embed()'s slot: an embedding, or prompt logprobs (top_n >= 0)
  std::vector<int32_t> tokens;
  Pooling pooling = Pooling::mean;
  int top_n = -1;
  std::promise<std::vector<float>> result;
  std::promise<std::vector<TokenLogprob>> logprobs;
  void fail(std::exception_ptr e) { top_n >= 0 ? logprobs.set_exception(e) : result.set_exception(e); }
};

struct Engine::Slot {
  enum class State { idle, prefill, generate };
  int index = 0;
  State state = State::idle;
  std::shared_ptr<Job> job;
  uint64_t order = 0;      // admission number (from 1): the oldest prefilling slot goes first; LRU
  int64_t n_past = 0;      // tokens in this slot's cache
  int32_t next_token = 0;  // sampled, to be fed in the next step
  std::vector<int32_t> tokens;  // the tokens in this slot's KV rows [0, tokens.size()), kept when idle
  int64_t ckpt_branch = 0;      // hybrid: a checkpoint where the prompt leaves the cached paths (0: none)
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<GrammarSampler> grammar;  // GenerateParams::grammar's state
  std::unique_ptr<Utf8Stream> utf8;
  std::unique_ptr<StopMatcher> stops;
};

namespace {

int64_t resolve_ctx(const Model& m, int64_t n_ctx) { return n_ctx > 0 ? n_ctx : m.config().n_ctx_train; }

// A checkpoint where a prompt leaves the cached paths is taken only when it saves a later request at
// least this many tokens over the checkpoint below it: each costs a copy of every recurrent layer.
constexpr int64_t kMinBranchGain = 32;

// The common prefix of a slot's tokens and a prompt, at most `limit` long.
int64_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b, int64_t limit) {
  const int64_t lim = std::min({(int64_t)a.size(), (int64_t)b.size(), limit});
  int64_t n = 0;
  while (n < lim && a[n] == b[n]) ++n;
  return n;
}

}  // namespace

Engine::Engine(const Model& model, const Tokenizer& tokenizer, const EngineOptions& opts)
    : model_(model),
      tok_(tokenizer),
      opts_(opts),
      pool_(opts.n_threads > 0 ? opts.n_threads : ThreadPool::default_threads()),
      cache_(model.config(), resolve_ctx(model, opts.n_ctx), std::max(1, opts.n_parallel),
             model.layer_devices(), opts.cache_types),
      state_cache_(model.config(), cache_.types(), opts.cache_ram_bytes),
      logits_(model.offload_device()) {
  opts_.n_parallel = std::max(1, opts_.n_parallel);
  if (model.config().n_expert > 0) routing_ = std::make_unique<RoutingStats>(model);
  if (routing_) rebalancer_ = opts.rebalancer;
  if (model.config().has_recurrent_layers()) state_ = std::make_unique<RecurrentState>(model.config(), opts_.n_parallel, model.layer_devices());
  opts_.prefill_chunk = std::max<int64_t>(1, opts_.prefill_chunk);
  opts_.checkpoint_every = std::max<int64_t>(0, opts_.checkpoint_every);
  for (int i = 0; i < opts_.n_parallel; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->index = i;
  }
  if (opts_.batch_tokens <= 0) opts_.batch_tokens = opts_.n_parallel + opts_.prefill_chunk;
  log::info("engine: {} slots of {} tokens ({:.1f} MiB KV cache), {} threads, prefill chunk {}, {} tokens a step",
            opts_.n_parallel, cache_.n_ctx(), cache_.bytes() / 1048576.0, pool_.size(), opts_.prefill_chunk,
            opts_.batch_tokens);
  if (!state_cache_.enabled())
    log::info("engine: state cache off (--cache-ram 0): only a slot's own rows are reused");
  else if (state_)
    log::info(
        "engine: state cache of up to {} MiB in RAM; recurrent checkpoints at prompt ends, every {} tokens",
        opts_.cache_ram_bytes >> 20, opts_.checkpoint_every);
  else
    log::info("engine: state cache of up to {} MiB in RAM", opts_.cache_ram_bytes >> 20);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& j : queue_) j->finish(Finish::error, "the server is shutting down");
}

std::shared_ptr<Job> Engine::submit(GenerateParams params) {
  if (params.prompt.empty()) fail("the prompt is empty");
  if ((int64_t)params.prompt.size() >= cache_.n_ctx())
    fail("the prompt has {} tokens; the context of a slot holds {} (at least one more is needed to generate)",
         params.prompt.size(), cache_.n_ctx());
  for (int32_t t : params.prompt)
    if (t < 0 || t >= model_.config().n_vocab)
      fail("token id {} is out of range [0, {})", t, model_.config().n_vocab);
  auto job = std::make_shared<Job>();
  job->submitted_ = std::chrono::steady_clock::now();
  job->n_prompt_ = (int64_t)params.prompt.size();
  job->params_ = std::move(params);
  {
    std::lock_guard lk(mu_);
    if (stop_) fail("the server is shutting down");
    const int free_slots = opts_.n_parallel - busy_.load();
    if ((int)queue_.size() >= opts_.max_queue + std::max(0, free_slots))
      throw QueueFull(
          fmt::format("the server is at capacity: {} slots busy and {} requests queued; retry later",
                      busy_.load(), queue_.size()));
    queue_.push_back(job);
  }
  cv_.notify_all();
  return job;
}

Engine::Stats Engine::stats() const {
  Stats s;
  s.busy_slots = busy_.load();
  s.prompt_tokens = prompt_tokens_.load();
  s.prompt_tokens_cached = cached_tokens_.load();
  s.prompt_tokens_total = prompt_total_.load();
  s.checkpoint_hits = checkpoint_hits_.load();
  s.checkpoint_misses = checkpoint_misses_.load();
  s.generated_tokens = generated_tokens_.load();
  s.steps = steps_.load();
  s.forward_seconds = forward_seconds_.load();
  if (routing_) {
    // Relaxed counters read while the engine adds: a snapshot a few tokens behind at worst.
    s.routed_tokens = routing_->max_tokens();
    const int64_t top = std::max<int64_t>(1, routing_->n_expert() / 4);
    double sum = 0;
    int64_t layers = 0;
    for (int64_t il = 0; il < routing_->n_layer(); ++il) {
      if (routing_->layer_total(il) == 0) continue;
      sum += routing_->top_share(il, top);
      ++layers;
    }
    s.top_quarter_share = layers ? sum / (double)layers : 0.0;
  }
  if (opts_.rebalancer) {
    s.rebalance_rounds = opts_.rebalancer->rounds_total();
    s.expert_moves = opts_.rebalancer->moves_total();
  }
  std::lock_guard lk(mu_);
  s.cache = cache_stats_;
  s.checkpoints_stored = cache_stats_.checkpoints_stored;
  s.queue_depth = (int)queue_.size();
  const auto horizon = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  int n = 0;
  for (auto& [t, k] : recent_)
    if (t >= horizon) n += k;
  s.tokens_per_second = n / 10.0;
  s.ttft_p50 = ttft_.quantile(0.5), s.ttft_p90 = ttft_.quantile(0.9);
  s.itl_p50 = itl_.quantile(0.5), s.itl_p90 = itl_.quantile(0.9);
  s.ttft_count = ttft_.total(), s.itl_count = itl_.total();
  s.ttft_sum = ttft_.sum(), s.itl_sum = itl_.sum();
  return s;
}

void Engine::clear_latency() {
  std::lock_guard lk(mu_);
  ttft_.clear();
  itl_.clear();
}

void Engine::release(Slot& s, Finish f, std::string error, int stop_index) {
  if (s.state == Slot::State::idle) return;
  std::shared_ptr<Job> job = std::move(s.job);
  s.sampler.reset();
  s.grammar.reset();
  s.utf8.reset();
  s.stops.reset();
  s.state = Slot::State::idle;
  s.n_past = 0;
  if (f == Finish::error) s.tokens.clear();  // a failed forward may have left the rows half-written
  busy_.fetch_sub(1);  // before finish(): whoever sees the end sees the slot free
  if (job) job->finish(f, std::move(error), stop_index);
}

// The free slot that can resume `job`'s prompt furthest: from its own rows (for a hybrid model only when
// the prompt continues its live recurrent state) or from the state cache, whichever is longer; ties go
// to the slot that copies least, then to the least recently used. What the slot held that the new
// request overwrites is saved to the state cache first; then the missing rows (and checkpoint) are
// restored from it. At least the last prompt token is evaluated, for its logits.
void Engine::admit(std::shared_ptr<Job> job) {
  const std::vector<int32_t>& prompt = job->params_.prompt;
  const int64_t limit = (int64_t)prompt.size() - 1;
  StateCache::Match m = state_cache_.match(prompt, limit);
  Slot* best = nullptr;
  int64_t best_common = 0, best_own = -1, best_resume = -1;
  for (const auto& slot : slots_) {
    Slot& s = *slot;
    if (s.state != Slot::State::idle) continue;
    const int64_t common = common_prefix(s.tokens, prompt, limit);
    const bool live = !state_ || (common == (int64_t)s.tokens.size() && state_->n_pos(s.index) == common);
    const int64_t own = live ? common : 0;
    const int64_t resume = std::max(own, m.resume);
    if (!best || resume > best_resume ||
        (resume == best_resume && (own > best_own || (own == best_own && s.order < best->order)))) {
      best = &s;
      best_common = common;
      best_own = own;
      best_resume = resume;
    }
  }
  XP_ASSERT(best);  // the loop admits no more jobs than there are free slots
  Slot& s = *best;
  int64_t resume = 0;
  try {
    if (best_own < (int64_t)s.tokens.size()) {
      save_slot(s);
      m = state_cache_.match(prompt, limit);  // may have grown, or lost to eviction
    }
    resume = std::max(best_own, m.resume);
    if (resume > best_own)
      state_cache_.restore(prompt, resume, std::min(best_common, resume), cache_, state_.get(), s.index);
  } catch (const std::exception& e) {
    // A copy that failed half-way leaves the slot's rows unknown: forget them.
    log::error("engine: state cache: {}", e.what());
    s.tokens.clear();
    if (state_) state_->reset(s.index);
    busy_.fetch_sub(1);
    job->finish(Finish::error, e.what());
    publish_cache_stats();
    return;
  }
  s.job = std::move(job);
  const GenerateParams& p = s.job->params_;
  s.state = Slot::State::prefill;
  s.order = ++admitted_;
  s.n_past = resume;  // rows past it are overwritten by the prefill
  s.tokens.assign(prompt.begin(), prompt.begin() + resume);
  // Where this prompt leaves the paths other requests took: the next one sharing that much resumes there.
  s.ckpt_branch = state_ && m.n_common >= resume + kMinBranchGain && m.n_common < limit ? m.n_common : 0;
  s.job->n_cached_.store(resume);
  cached_tokens_.fetch_add(resume);
  prompt_total_.fetch_add(prompt.size());
  if (state_) (resume > 0 ? checkpoint_hits_ : checkpoint_misses_).fetch_add(1);
  s.sampler = std::make_unique<Sampler>(p.sampling);
  for (int32_t t : p.prompt) s.sampler->accept(t);
  if (p.grammar) {
    if (!trie_) {
      std::vector<std::string> pieces((size_t)tok_.n_vocab());
      for (int32_t id = 0; id < tok_.n_vocab(); ++id) pieces[id] = tok_.token_to_piece(id, false);
      trie_ = std::make_unique<TokenTrie>(pieces);
    }
    if (grammar_tables_.size() >= 32 && !grammar_tables_.count(p.grammar->source()))
      grammar_tables_.clear();  // requests in flight keep theirs
    auto& tables = grammar_tables_[p.grammar->source()];
    if (!tables) tables = std::make_shared<GrammarTables>();
    s.grammar = std::make_unique<GrammarSampler>(p.grammar, *trie_, tok_.eog_ids(), tables, p.grammar_after);
  }
  s.utf8 = std::make_unique<Utf8Stream>(tok_);
  s.stops = std::make_unique<StopMatcher>(p.stop);
  maybe_store(s);  // e.g. a prompt that continues a slot's live state up to its last token
  publish_cache_stats();
}

// Saves what an idle slot holds (its tokens' KV rows; for a hybrid model also a checkpoint of its live
// recurrent state) to the state cache before another request overwrites it.
void Engine::save_slot(Slot& s) {
  if (!state_cache_.enabled() || s.tokens.empty()) return;
  if (state_ && state_->n_pos(s.index) != (int64_t)s.tokens.size()) return;  // no state to go with the rows
  state_cache_.store(s.tokens, cache_, state_.get(), s.index);
}

// The next position at which the slot's prefill stops for maybe_store() (hybrid models; INT64_MAX: none).
int64_t Engine::next_checkpoint(const Slot& s) const {
  int64_t next = INT64_MAX;
  if (!state_ || !state_cache_.enabled()) return next;
  const int64_t pos = s.n_past, before_last = (int64_t)s.job->params_.prompt.size() - 1;
  if (s.ckpt_branch > pos) next = s.ckpt_branch;
  if (before_last > pos) next = std::min(next, before_last);
  if (const int64_t every = opts_.checkpoint_every; every > 0)
    next = std::min(next, (pos / every + 1) * every);
  return next;
}

// After a step (or admission): saves the slot's state to the state cache where planned. Dense models:
// the whole prompt once it is prefilled, so a parallel request sharing it finds it while this slot is
// still busy. Hybrid models: checkpoints before the prompt's last token (an identical prompt then
// resumes too), at the branch point, and every checkpoint_every positions (also while generating).
void Engine::maybe_store(Slot& s) {
  if (!state_cache_.enabled() || s.n_past <= 0) return;
  const int64_t pos = s.n_past, n_prompt = (int64_t)s.job->params_.prompt.size();
  const bool prefill = s.state == Slot::State::prefill;
  bool due;
  if (!state_)
    due = prefill && pos == n_prompt;
  else
    due = (prefill && (pos == n_prompt - 1 || pos == s.ckpt_branch)) ||
          (opts_.checkpoint_every > 0 && pos % opts_.checkpoint_every == 0);
  if (!due) return;
  state_cache_.store(s.tokens, cache_, state_.get(), s.index);
  publish_cache_stats();
}

void Engine::publish_cache_stats() {
  const StateCacheStats st = state_cache_.stats();
  std::lock_guard lk(mu_);
  cache_stats_ = st;
}

void Engine::loop() {
  std::vector<Slot*> active;
  std::vector<std::shared_ptr<Job>> admitted;
  std::deque<std::unique_ptr<EmbedTask>> tasks;
  while (true) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || !tasks_.empty() || busy_.load() > 0; });
      if (stop_) break;
      tasks.swap(tasks_);
      // Take queued requests for the free slots, dropping the ones whose client already left; admitting
      // them (cache copies) happens outside the lock.
      int free_slots = 0;
      for (const auto& slot : slots_) free_slots += slot->state == Slot::State::idle;
      while (!queue_.empty() && (free_slots > 0 || queue_.front()->cancelled())) {
        std::shared_ptr<Job> job = std::move(queue_.front());
        queue_.pop_front();
        if (job->cancelled()) {
          job->finish(Finish::cancelled);
          continue;
        }
        busy_.fetch_add(1);
        admitted.push_back(std::move(job));
        --free_slots;
      }
    }
    for (auto& t : tasks) {  // embeddings: between steps, with the model to themselves
      try {
        if (t->top_n >= 0) {
          t->logprobs.set_value(prompt_logprobs_now(t->tokens, t->top_n));
        } else {
          t->result.set_value(embed_now(t->tokens, t->pooling));
        }
      } catch (...) {
        t->fail(std::current_exception());
      }
    }
    tasks.clear();
    for (auto& job : admitted) admit(std::move(job));
    admitted.clear();
    for (auto& slot : slots_)
      if (slot->state != Slot::State::idle && slot->job->cancelled()) release(*slot, Finish::cancelled);
    int64_t n_forwarded = 0;
    try {
      n_forwarded = step(active);
    } catch (const std::exception& e) {
      // A failed forward leaves the batch's slots in an unknown state: end those requests, keep serving.
      log::error("engine: step failed: {}", e.what());
      for (Slot* s : active) release(*s, Finish::error, e.what());
    }
    if (rebalancer_ && n_forwarded > 0) {
      // Between passes: no forward reads the weights that move. A move that fails is undone (the ones
      // before it stay; Model::move_experts); serving goes on without rebalancing.
      try {
        rebalancer_->after_pass(n_forwarded, *routing_);
      } catch (const std::exception& e) {
        log::error("engine: moving experts failed, rebalancing is off from now: {}", e.what());
        rebalancer_ = nullptr;
      }
    }
  }
  for (auto& slot : slots_)
    if (slot->state != Slot::State::idle) release(*slot, Finish::error, "the server is shutting down");
  std::lock_guard lk(mu_);
  for (auto& t : tasks_) t->fail(std::make_exception_ptr(Error("the server is shutting down")));
  tasks_.clear();
}

void Engine::check_input(const std::vector<int32_t>& tokens) const {
  if (tokens.empty()) fail("the input is empty");
  if ((int64_t)tokens.size() > cache_.n_ctx())
    fail("the input has {} tokens; the context of a slot holds {}", tokens.size(), cache_.n_ctx());
  for (int32_t t : tokens)
    if (t < 0 || t >= model_.config().n_vocab)
      fail("token id {} is out of range [0, {})", t, model_.config().n_vocab);
}

std::vector<TokenLogprob> Engine::prompt_logprobs(std::vector<int32_t> tokens, int top_n) {
  check_input(tokens);
  auto task = std::make_unique<EmbedTask>();
  task->tokens = std::move(tokens);
  task->top_n = std::max(top_n, 0);
  std::future<std::vector<TokenLogprob>> done = task->logprobs.get_future();
  {
    std::lock_guard lk(mu_);
    if (stop_) fail("the server is shutting down");
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
  return done.get();
}

std::vector<TokenLogprob> Engine::prompt_logprobs_now(const std::vector<int32_t>& tokens, int top_n) {
  const ModelConfig& c = model_.config();
  if (!embed_cache_)
    embed_cache_ = std::make_unique<KvCache>(c, cache_.n_ctx(), 1, model_.layer_devices(), opts_.cache_types);
  if (state_ && !embed_state_) embed_state_ = std::make_unique<RecurrentState>(c, 1, model_.layer_devices());
  if (embed_state_) embed_state_->reset(0);
  const int64_t n = (int64_t)tokens.size(), V = c.n_vocab, chunk = std::min<int64_t>(opts_.prefill_chunk, 32);
  std::vector<TokenLogprob> out(n);
  for (int64_t i = 0; i < n; ++i) {
    out[i].id = tokens[i];
    out[i].piece = tok_.token_to_piece(tokens[i], false);
  }
  std::vector<float> logits;
  // Row r of a chunk predicts token pos + r + 1; the last token predicts nothing.
  for (int64_t pos = 0; pos + 1 < n; pos += chunk) {
    const int64_t len = std::min(chunk, n - 1 - pos);
    model_.forward({.tokens = std::span<const int32_t>(tokens).subspan(pos, len),
                    .pos0 = (int32_t)pos,
                    .cache = embed_cache_.get(),
                    .seq = 0,
                    .all_logits = true,
                    .state = embed_state_.get()},
                   logits, pool_);
    for (int64_t r = 0; r < len; ++r) {
      const std::span<const float> row(logits.data() + r * V, V);
      const float mx = *std::max_element(row.begin(), row.end());
      double sum = 0;
      for (float l : row) sum += std::exp((double)l - mx);
      const double lse = mx + std::log(sum);
      TokenLogprob& lp = out[pos + r + 1];
      lp.logprob = (float)(row[lp.id] - lse);
      for (const TokenProb& t : Sampler::top_n(row, top_n))
        lp.top.emplace_back(tok_.token_to_piece(t.id, false), (float)(t.logit - lse));
    }
  }
  return out;
}

std::vector<float> Engine::embed(std::vector<int32_t> tokens, Pooling pooling) {
  check_input(tokens);
  auto task = std::make_unique<EmbedTask>();
  task->tokens = std::move(tokens);
  task->pooling = pooling;
  std::future<std::vector<float>> done = task->result.get_future();
  {
    std::lock_guard lk(mu_);
    if (stop_) fail("the server is shutting down");
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
  return done.get();
}

std::vector<float> Engine::embed_now(const std::vector<int32_t>& tokens, Pooling pooling) {
  const ModelConfig& c = model_.config();
  if (!embed_cache_)
    embed_cache_ = std::make_unique<KvCache>(c, cache_.n_ctx(), 1, model_.layer_devices(), opts_.cache_types);
  if (state_ && !embed_state_) embed_state_ = std::make_unique<RecurrentState>(c, 1, model_.layer_devices());
  if (embed_state_) embed_state_->reset(0);
  const int64_t n = (int64_t)tokens.size(), E = c.n_embd;
  std::vector<double> sum(E, 0.0);
  std::vector<float> hidden, logits;
  for (int64_t pos = 0; pos < n; pos += opts_.prefill_chunk) {
    const int64_t len = std::min(opts_.prefill_chunk, n - pos);
    const bool first = pos == 0, last = pos + len == n;
    // Only the rows pooling needs: every row (mean), the first chunk's (cls), the last token's (last).
    const bool rows = pooling == Pooling::mean || (pooling == Pooling::cls && first);
    model_.forward({.tokens = std::span<const int32_t>(tokens).subspan(pos, len),
                    .pos0 = (int32_t)pos,
                    .cache = embed_cache_.get(),
                    .seq = 0,
                    .all_logits = rows,
                    .state = embed_state_.get(),
                    .hidden = &hidden},
                   logits, pool_);
    if (pooling == Pooling::mean) {
      for (int64_t r = 0; r < len; ++r)
        for (int64_t i = 0; i < E; ++i) sum[i] += hidden[r * E + i];
    } else if ((pooling == Pooling::cls && first) || (pooling == Pooling::last && last)) {
      const float* row = pooling == Pooling::cls ? hidden.data() : hidden.data() + hidden.size() - E;
      for (int64_t i = 0; i < E; ++i) sum[i] = row[i];
    }
  }
  double norm = 0;
  for (double v : sum) norm += v * v;
  norm = std::sqrt(norm);
  std::vector<float> out(E);
  for (int64_t i = 0; i < E; ++i) out[i] = norm > 0 ? (float)(sum[i] / norm) : 0.0f;
  return out;
}

std::vector<int64_t> share_prefill_budget(const std::vector<int64_t>& want, int64_t left) {
  const size_t n = want.size();
  std::vector<int64_t> give(n, 0);
  std::vector<size_t> by_want(n);
  for (size_t i = 0; i < n; ++i) by_want[i] = i;
  std::stable_sort(by_want.begin(), by_want.end(), [&](size_t a, size_t b) { return want[a] < want[b]; });
  size_t j = 0;  // the wants at or below an even share of what is left are met
  for (; j < n && want[by_want[j]] <= left / (int64_t)(n - j); ++j) {
    give[by_want[j]] = want[by_want[j]];
    left -= want[by_want[j]];
  }
  if (j == n) return give;
  // The others (each wants more than the even share) split the rest, oldest first for the remainder.
  const int64_t m = (int64_t)(n - j), base = left / m;
  int64_t rem = left % m;
  std::vector<bool> met(n, false);
  for (size_t q = 0; q < j; ++q) met[by_want[q]] = true;
  for (size_t i = 0; i < n; ++i)
    if (!met[i]) give[i] = base + (rem > 0 ? (--rem, 1) : 0);
  return give;
}

// How many prompt tokens each prefilling slot (oldest first) evaluates this step, after n_decode tokens of
// generating slots: what the budget leaves (at least one token), shared by share_prefill_budget. Each slot
// wants up to prefill_chunk, less at its prompt's end or its next checkpoint.
std::vector<int64_t> Engine::prefill_shares(const std::vector<Slot*>& waiting, int64_t n_decode) const {
  std::vector<int64_t> want;
  for (const Slot* s : waiting)
    want.push_back(std::min({opts_.prefill_chunk, (int64_t)s->job->params_.prompt.size() - s->n_past,
                             next_checkpoint(*s) - s->n_past}));
  return share_prefill_budget(want, std::max<int64_t>(1, opts_.batch_tokens - n_decode));
}

int64_t Engine::step(std::vector<Slot*>& active) {
  active.clear();
  std::vector<int32_t> tokens;
  std::vector<BatchSegment> segs;
  std::vector<Slot*> waiting;  // prefilling, oldest first
  for (auto& slot : slots_) {
    Slot& s = *slot;
    if (s.state == Slot::State::generate) {
      tokens.push_back(s.next_token);
      segs.push_back({.seq = s.index, .pos0 = (int32_t)s.n_past, .n_tokens = 1});
      active.push_back(&s);
    } else if (s.state == Slot::State::prefill) {
      waiting.push_back(&s);
    }
  }
  std::sort(waiting.begin(), waiting.end(), [](const Slot* a, const Slot* b) { return a->order < b->order; });
  const std::vector<int64_t> chunks = prefill_shares(waiting, (int64_t)tokens.size());
  int64_t n_prefill = 0;
  for (size_t i = 0; i < waiting.size(); ++i) {
    if (chunks[i] == 0) continue;
    Slot& s = *waiting[i];
    const auto& prompt = s.job->params_.prompt;
    tokens.insert(tokens.end(), prompt.begin() + s.n_past, prompt.begin() + s.n_past + chunks[i]);
    segs.push_back({.seq = s.index, .pos0 = (int32_t)s.n_past, .n_tokens = (int32_t)chunks[i]});
    active.push_back(&s);
    n_prefill += chunks[i];
  }
  if (segs.empty()) return 0;

  const auto t0 = std::chrono::steady_clock::now();
  logits_.ensure(segs.size() * (size_t)model_.config().n_vocab);  // a row of logits a segment
  model_.forward({.tokens = tokens,
                  .cache = &cache_,
                  .segments = segs,
                  .state = state_.get(),
                  .routing_stats = routing_.get()},
                 logits_.get(), pool_);
  XP_ASSERT(logits_.intact());
  const auto t1 = std::chrono::steady_clock::now();
  forward_seconds_.store(forward_seconds_.load() + std::chrono::duration<double>(t1 - t0).count());
  steps_.fetch_add(1);
  prompt_tokens_.fetch_add(n_prefill);  // evaluated

  const int64_t V = model_.config().n_vocab;
  int n_generated = 0;
  std::vector<std::pair<Slot*, std::span<const float>>> to_sample;
  for (size_t i = 0; i < active.size(); ++i) {
    Slot& s = *active[i];
    if (s.state == Slot::State::generate) {
      s.tokens.push_back(s.next_token);
    } else {
      const auto& prompt = s.job->params_.prompt;
      s.tokens.insert(s.tokens.end(), prompt.begin() + s.n_past, prompt.begin() + s.n_past + segs[i].n_tokens);
    }
    s.n_past += segs[i].n_tokens;
    maybe_store(s);
    if (s.state == Slot::State::prefill) {
      if (s.n_past < (int64_t)s.job->params_.prompt.size()) continue;  // more prompt to go
      s.state = Slot::State::generate;
    }
    Job& job = *s.job;
    {  // before the token goes out (and may end the job): whoever sees it sees its latency counted
      std::lock_guard lk(mu_);
      if (job.ttft_.load() < 0) {
        job.ttft_.store(std::chrono::duration<double>(t1 - job.submitted_).count());
        ttft_.add(job.ttft_.load());
      } else {
        itl_.add(std::chrono::duration<double>(t1 - job.last_token_).count());
      }
    }
    job.last_token_ = t1;
    to_sample.push_back({&s, std::span<const float>(logits_.get().data() + i * V, V)});
    ++n_generated;
  }
  // Each slot's sampler is its own: the picks of slots without a grammar run in parallel (64 greedy picks
  // over a 152k vocabulary are ~5 ms on one core); a grammar's picks stay on this thread (grammar sampling in
  // parallel made ConstrainedTest fail now and then). What they emit goes out in slot order, on this thread.
  std::vector<Pick> picks(to_sample.size());
  pool_.parallel_for((int64_t)to_sample.size(), [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j)
      if (!to_sample[j].first->grammar) picks[j] = pick(*to_sample[j].first, to_sample[j].second);
  });
  for (size_t j = 0; j < to_sample.size(); ++j)
    if (to_sample[j].first->grammar) picks[j] = pick(*to_sample[j].first, to_sample[j].second);
  for (size_t j = 0; j < to_sample.size(); ++j) emit(*to_sample[j].first, picks[j], to_sample[j].second);
  std::lock_guard lk(mu_);
  recent_.emplace_back(t1, n_generated);
  while (!recent_.empty() && recent_.front().first < t1 - std::chrono::seconds(10)) recent_.pop_front();
  return (int64_t)tokens.size();
}

Engine::Pick Engine::pick(Slot& s, std::span<const float> logits) {
  Pick k;
  try {
    k.id = s.grammar ? s.grammar->sample(*s.sampler, logits) : s.sampler->sample(logits);
  } catch (const GrammarError& e) {
    k.error = e.what();
  }
  return k;
}

void Engine::emit(Slot& s, const Pick& k, std::span<const float> logits) {
  Job& job = *s.job;
  const GenerateParams& p = job.params_;
  const int32_t id = k.id;
  if (!k.error.empty()) {
    release(s, Finish::error, k.error);
    return;
  }
  if (id < 0) {
    release(s, Finish::error, "grammar: no token can continue the output (the vocabulary cannot spell what the "
                              "grammar needs next, or logit_bias bans it)");
    return;
  }
  if (!p.ignore_eos && tok_.is_eog(id)) {
    std::string rest = s.stops->push(s.utf8->flush()).text;
    if (!s.stops->stopped()) rest += s.stops->flush();
    job.push(std::move(rest), nullptr);
    release(s, Finish::stop);
    return;
  }
  s.sampler->accept(id);
  job.n_generated_.fetch_add(1);
  generated_tokens_.fetch_add(1);

  TokenLogprob lp;
  if (p.top_logprobs >= 0) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float l : logits) sum += std::exp((double)l - mx);
    const double lse = mx + std::log(sum);
    lp.id = id;
    lp.piece = tok_.token_to_piece(id, false);
    lp.logprob = (float)(logits[id] - lse);
    if (p.top_logprobs > 0)
      for (const TokenProb& t : Sampler::top_n(logits, p.top_logprobs))
        lp.top.emplace_back(tok_.token_to_piece(t.id, false), (float)(t.logit - lse));
  }
  StopMatcher::Step st = s.stops->push(s.utf8->push(id));
  if (st.stopped) {
    job.push(std::move(st.text), p.top_logprobs >= 0 ? &lp : nullptr);
    release(s, Finish::stop, {}, (int)st.stop_index);
    return;
  }
  const bool at_max = p.max_tokens > 0 && job.n_generated() >= p.max_tokens;
  const bool ctx_full = s.n_past >= cache_.n_ctx();  // no room to feed this token back
  const bool grammar_done = s.grammar && s.grammar->finished();
  if (at_max || ctx_full || grammar_done) {
    st.text += s.stops->push(s.utf8->flush()).text;
    if (!s.stops->stopped()) st.text += s.stops->flush();
    job.push(std::move(st.text), p.top_logprobs >= 0 ? &lp : nullptr);
    release(s, s.stops->stopped() || grammar_done ? Finish::stop : Finish::length);
    return;
  }
  job.push(std::move(st.text), p.top_logprobs >= 0 ? &lp : nullptr);
  s.next_token = id;
}

}  // namespace xpert
