#include "runtime/engine.h"

#include <algorithm>
#include <cmath>

#include "base/log.h"
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

void Job::finish(Finish f, std::string error) {
  std::lock_guard lk(mu_);
  if (done_) return;
  pending_.finish = f;
  pending_.error = std::move(error);
  done_ = has_news_ = true;
  cv_.notify_all();
}

// --- Engine ----------------------------------------------------------------------------------------

struct Engine::Slot {
  enum class State { idle, prefill, generate };
  int index = 0;
  State state = State::idle;
  std::shared_ptr<Job> job;
  uint64_t order = 0;      // admission number (from 1): the oldest prefilling slot goes first; LRU
  int64_t n_past = 0;      // tokens in this slot's cache
  int32_t next_token = 0;  // sampled, to be fed in the next step
  std::vector<int32_t> tokens;  // the tokens in this slot's KV rows [0, tokens.size()), kept when idle
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Utf8Stream> utf8;
  std::unique_ptr<StopMatcher> stops;
};

namespace {
int64_t resolve_ctx(const Model& m, int64_t n_ctx) { return n_ctx > 0 ? n_ctx : m.config().n_ctx_train; }
}  // namespace

Engine::Engine(const Model& model, const Tokenizer& tokenizer, const EngineOptions& opts)
    : model_(model),
      tok_(tokenizer),
      opts_(opts),
      pool_(opts.n_threads > 0 ? opts.n_threads : ThreadPool::default_threads()),
      cache_(model.config(), resolve_ctx(model, opts.n_ctx), std::max(1, opts.n_parallel), model.layer_devices()) {
  opts_.n_parallel = std::max(1, opts_.n_parallel);
  if (model.config().has_recurrent_layers()) state_ = std::make_unique<RecurrentState>(model.config(), opts_.n_parallel, model.layer_devices());
  opts_.prefill_chunk = std::max<int64_t>(1, opts_.prefill_chunk);
  for (int i = 0; i < opts_.n_parallel; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->index = i;
  }
  log::info("engine: {} slots of {} tokens ({:.1f} MiB KV cache), {} threads, prefill chunk {}",
            opts_.n_parallel, cache_.n_ctx(), cache_.bytes() / 1048576.0, pool_.size(), opts_.prefill_chunk);
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
  s.generated_tokens = generated_tokens_.load();
  s.steps = steps_.load();
  s.forward_seconds = forward_seconds_.load();
  std::lock_guard lk(mu_);
  s.queue_depth = (int)queue_.size();
  const auto horizon = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  int n = 0;
  for (auto& [t, k] : recent_)
    if (t >= horizon) n += k;
  s.tokens_per_second = n / 10.0;
  return s;
}

void Engine::release(Slot& s, Finish f, std::string error) {
  if (s.state == Slot::State::idle) return;
  std::shared_ptr<Job> job = std::move(s.job);
  s.sampler.reset();
  s.utf8.reset();
  s.stops.reset();
  s.state = Slot::State::idle;
  s.n_past = 0;
  if (f == Finish::error) s.tokens.clear();  // a failed forward may have left the rows half-written
  busy_.fetch_sub(1);  // before finish(): whoever sees the end sees the slot free
  if (job) job->finish(f, std::move(error));
}

// The free slot whose cached tokens share the longest prefix with `prompt` (ties: least recently used);
// `n_reuse` gets the prefix length to keep, leaving at least the last prompt token to evaluate for logits.
Engine::Slot* Engine::pick_slot(const std::vector<int32_t>& prompt, int64_t& n_reuse) const {
  const bool can_reuse = !model_.config().has_recurrent_layers();
  Slot* best = nullptr;
  int64_t best_n = -1;
  for (const auto& slot : slots_) {
    if (slot->state != Slot::State::idle) continue;
    int64_t n = 0;
    if (can_reuse) {
      const size_t lim = std::min(slot->tokens.size(), prompt.size() - 1);
      while ((size_t)n < lim && slot->tokens[n] == prompt[n]) ++n;
    }
    if (n > best_n || (n == best_n && slot->order < best->order)) {
      best = slot.get();
      best_n = n;
    }
  }
  n_reuse = std::max<int64_t>(0, best_n);
  return best;
}

void Engine::loop() {
  std::vector<Slot*> active;
  while (true) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || busy_.load() > 0; });
      if (stop_) break;
      // Admit queued requests into free slots; drop the ones whose client already left.
      while (true) {
        while (!queue_.empty() && queue_.front()->cancelled()) {
          queue_.front()->finish(Finish::cancelled);
          queue_.pop_front();
        }
        if (queue_.empty()) break;
        int64_t n_reuse = 0;
        Slot* picked = pick_slot(queue_.front()->params_.prompt, n_reuse);
        if (!picked) break;
        Slot& s = *picked;
        s.job = std::move(queue_.front());
        queue_.pop_front();
        const GenerateParams& p = s.job->params_;
        s.state = Slot::State::prefill;
        s.order = ++admitted_;
        s.n_past = n_reuse;  // rows past it are overwritten by the prefill
        s.tokens.resize(n_reuse);
        s.job->n_cached_.store(n_reuse);
        cached_tokens_.fetch_add(n_reuse);
        s.sampler = std::make_unique<Sampler>(p.sampling);
        for (int32_t t : p.prompt) s.sampler->accept(t);
        s.utf8 = std::make_unique<Utf8Stream>(tok_);
        s.stops = std::make_unique<StopMatcher>(p.stop);
        busy_.fetch_add(1);
      }
    }
    for (auto& slot : slots_)
      if (slot->state != Slot::State::idle && slot->job->cancelled()) release(*slot, Finish::cancelled);
    try {
      step(active);
    } catch (const std::exception& e) {
      // A failed forward leaves the batch's slots in an unknown state: end those requests, keep serving.
      log::error("engine: step failed: {}", e.what());
      for (Slot* s : active) release(*s, Finish::error, e.what());
    }
  }
  for (auto& slot : slots_)
    if (slot->state != Slot::State::idle) release(*slot, Finish::error, "the server is shutting down");
}

void Engine::step(std::vector<Slot*>& active) {
  active.clear();
  std::vector<int32_t> tokens;
  std::vector<BatchSegment> segs;
  Slot* prefill = nullptr;
  for (auto& slot : slots_) {
    Slot& s = *slot;
    if (s.state == Slot::State::generate) {
      tokens.push_back(s.next_token);
      segs.push_back({.seq = s.index, .pos0 = (int32_t)s.n_past, .n_tokens = 1});
      active.push_back(&s);
    } else if (s.state == Slot::State::prefill && (!prefill || s.order < prefill->order)) {
      prefill = &s;
    }
  }
  int64_t n_prefill = 0;
  if (prefill) {
    const auto& prompt = prefill->job->params_.prompt;
    n_prefill = std::min<int64_t>(opts_.prefill_chunk, (int64_t)prompt.size() - prefill->n_past);
    tokens.insert(tokens.end(), prompt.begin() + prefill->n_past,
                  prompt.begin() + prefill->n_past + n_prefill);
    segs.push_back({.seq = prefill->index, .pos0 = (int32_t)prefill->n_past, .n_tokens = (int32_t)n_prefill});
    active.push_back(prefill);
  }
  if (segs.empty()) return;

  const auto t0 = std::chrono::steady_clock::now();
  model_.forward({.tokens = tokens, .cache = &cache_, .segments = segs, .state = state_.get()}, logits_, pool_);
  const auto t1 = std::chrono::steady_clock::now();
  forward_seconds_.store(forward_seconds_.load() + std::chrono::duration<double>(t1 - t0).count());
  steps_.fetch_add(1);
  prompt_tokens_.fetch_add(n_prefill);

  const int64_t V = model_.config().n_vocab;
  int n_generated = 0;
  for (size_t i = 0; i < active.size(); ++i) {
    Slot& s = *active[i];
    if (s.state == Slot::State::generate) {
      s.tokens.push_back(s.next_token);
    } else {
      const auto& prompt = s.job->params_.prompt;
      s.tokens.insert(s.tokens.end(), prompt.begin() + s.n_past, prompt.begin() + s.n_past + segs[i].n_tokens);
    }
    s.n_past += segs[i].n_tokens;
    if (s.state == Slot::State::prefill) {
      if (s.n_past < (int64_t)s.job->params_.prompt.size()) continue;  // more prompt to go
      s.state = Slot::State::generate;
    }
    sample_and_emit(s, std::span<const float>(logits_.data() + i * V, V));
    ++n_generated;
  }
  std::lock_guard lk(mu_);
  recent_.emplace_back(t1, n_generated);
  while (!recent_.empty() && recent_.front().first < t1 - std::chrono::seconds(10)) recent_.pop_front();
}

void Engine::sample_and_emit(Slot& s, std::span<const float> logits) {
  Job& job = *s.job;
  const GenerateParams& p = job.params_;
  const int32_t id = s.sampler->sample(logits);
  if (tok_.is_eog(id)) {
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
    release(s, Finish::stop);
    return;
  }
  const bool at_max = p.max_tokens > 0 && job.n_generated() >= p.max_tokens;
  const bool ctx_full = s.n_past >= cache_.n_ctx();  // no room to feed this token back
  if (at_max || ctx_full) {
    st.text += s.stops->push(s.utf8->flush()).text;
    if (!s.stops->stopped()) st.text += s.stops->flush();
    job.push(std::move(st.text), p.top_logprobs >= 0 ? &lp : nullptr);
    release(s, s.stops->stopped() ? Finish::stop : Finish::length);
    return;
  }
  job.push(std::move(st.text), p.top_logprobs >= 0 ? &lp : nullptr);
  s.next_token = id;
}

}  // namespace xpert
