#include "runtime/session.h"

#include <algorithm>

#include "base/error.h"

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
      cache_(model.config(), resolve_ctx(model, opts.n_ctx), 1, model.layer_devices()) {
  if (model.config().has_recurrent_layers()) state_ = std::make_unique<RecurrentState>(model.config(), 1, model.layer_devices());
}

void Session::reset() {
  n_past_ = 0;
  if (state_) state_->reset();
}

const std::vector<float>& Session::eval(std::span<const int32_t> tokens) {
  if (tokens.empty()) fail("nothing to evaluate");
  if (n_past_ + (int64_t)tokens.size() > cache_.n_ctx())
    fail("context is full: {} tokens in the context plus {} new exceed -c {}", n_past_, tokens.size(), cache_.n_ctx());
  const int64_t chunk = std::max<int64_t>(1, opts_.n_batch);
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    const size_t n = std::min<size_t>(chunk, tokens.size() - i);
    ForwardArgs a{.tokens = tokens.subspan(i, n), .pos0 = (int32_t)n_past_, .cache = &cache_, .seq = 0, .all_logits = false,
                  .state = state_.get()};
    model_.forward(a, logits_, pool_);
    n_past_ += n;
  }
  return logits_;
}

bool Session::truncate(int64_t n) {
  if (n < 0 || n > n_past_) fail("cannot keep {} tokens of {}", n, n_past_);
  if (n == n_past_) return true;
  if (state_) {
    reset();
    return n == 0;
  }
  n_past_ = n;  // rows past n are overwritten by the next eval
  return true;
}

}  // namespace xpert
