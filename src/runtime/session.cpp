#include "runtime/session.h"

#include <algorithm>

#include "base/error.h"
#include "runtime/experts/routing_stats.h"
#include "runtime/state_cache.h"

namespace xpert {

namespace {
int64_t resolve_ctx(const Model& m, int64_t n_ctx) {
  if (n_ctx <= 0) return m.config().n_ctx_train;
  return n_ctx;
}
}  // namespace

Session::Session(const Model& model, const SessionOptions& opts)
    : model_(model),
      opts_(opts),
      pool_(opts.n_threads > 0 ? opts.n_threads : ThreadPool::default_threads()),
      cache_(model.config(), resolve_ctx(model, opts.n_ctx), 1, model.layer_devices(), opts.cache_types),
      logits_(model.offload_device()) {
  if (model.config().has_recurrent_layers()) state_ = std::make_unique<RecurrentState>(model.config(), 1, model.layer_devices());
}

void Session::reset() {
  n_past_ = 0;
  checkpoints_.clear();
  if (state_) state_->reset();
}

const std::vector<float>& Session::eval(std::span<const int32_t> tokens) {
  if (tokens.empty()) fail("nothing to evaluate");
  if (n_past_ + (int64_t)tokens.size() > cache_.n_ctx())
    fail("context is full: {} tokens in the context plus {} new exceed -c {}", n_past_, tokens.size(), cache_.n_ctx());
  const int64_t chunk = std::max<int64_t>(1, opts_.n_batch);
  const int64_t every = state_ && opts_.cache_ram_bytes > 0 ? opts_.checkpoint_every : 0;
  for (size_t i = 0; i < tokens.size();) {
    size_t n = std::min<size_t>(chunk, tokens.size() - i);
    if (every > 0) n = std::min<size_t>(n, (n_past_ / every + 1) * every - n_past_);  // up to a checkpoint
    ForwardArgs a{.tokens = tokens.subspan(i, n), .pos0 = (int32_t)n_past_, .cache = &cache_, .seq = 0, .all_logits = false,
                  .state = state_.get(), .routing_stats = opts_.routing_stats};
    logits_.ensure((size_t)model_.config().n_vocab);  // one row of logits a forward (all_logits false)
    model_.forward(a, logits_.get(), pool_);
    XP_ASSERT(logits_.intact());
    n_past_ += n;
    i += n;
    if (every > 0 && n_past_ % every == 0) checkpoint();
  }
  return logits_.get();
}

int64_t Session::truncate(int64_t n) {
  if (n < 0 || n > n_past_) fail("cannot keep {} tokens of {}", n, n_past_);
  if (n == n_past_) return n;
  // Checkpoints past n belong to tokens that are being dropped. The KV rows below n stay valid: rows
  // past n are overwritten by the next eval.
  std::erase_if(checkpoints_, [n](const Checkpoint& c) { return c.pos > n; });
  if (!state_) {
    n_past_ = n;
    return n;
  }
  Checkpoint* best = nullptr;
  for (Checkpoint& c : checkpoints_)
    if (!best || c.pos > best->pos) best = &c;
  if (!best) {
    reset();
    return 0;
  }
  load_recurrent(model_.config(), *state_, 0, best->state, best->pos);
  best->used = ++clock_;
  n_past_ = best->pos;
  return n_past_;
}

void Session::checkpoint() {
  if (!state_ || opts_.cache_ram_bytes == 0 || n_past_ == 0) return;
  for (Checkpoint& c : checkpoints_)
    if (c.pos == n_past_) {
      c.used = ++clock_;
      return;
    }
  const auto& recurrent = model_.config().layer_recurrent;
  const size_t bytes =
      state_->slot_floats() * sizeof(float) * std::count(recurrent.begin(), recurrent.end(), true);
  if (bytes > opts_.cache_ram_bytes) return;
  while ((checkpoints_.size() + 1) * bytes > opts_.cache_ram_bytes) {
    auto lru = std::min_element(checkpoints_.begin(), checkpoints_.end(),
                                [](const Checkpoint& a, const Checkpoint& b) { return a.used < b.used; });
    checkpoints_.erase(lru);
  }
  checkpoints_.push_back(
      {.pos = n_past_, .state = save_recurrent(model_.config(), *state_, 0), .used = ++clock_});
}

}  // namespace xpert
