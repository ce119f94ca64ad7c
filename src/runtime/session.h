// One sequence being evaluated: the model, its KV cache (and recurrent state, for hybrid models), the
// thread pool and the position reached.
// eval() appends tokens (prefilled in chunks of n_batch) and returns the logits of the last one.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "model/model.h"
#include "runtime/kv_cache.h"
#include "runtime/recurrent_state.h"

namespace xpert {

struct SessionOptions {
  int64_t n_ctx = 4096;   // 0: the model's trained context
  int n_threads = 0;      // 0: physical cores
  int64_t n_batch = 512;  // prefill chunk
};

class Session {
 public:
  Session(const Model& model, const SessionOptions& opts);
  const std::vector<float>& eval(std::span<const int32_t> tokens);
  int64_t n_past() const { return n_past_; }
  int64_t n_ctx() const { return cache_.n_ctx(); }
  void reset();
  // Keeps the first n tokens and drops the rest, so the next eval() continues at position n. The KV
  // cache can always be cut; a recurrent state cannot be rolled back, so for hybrid models a cut below
  // n_past() starts over (returns false: the caller must evaluate from 0). Checkpoints will lift this.
  bool truncate(int64_t n);
  ThreadPool& pool() { return pool_; }
  const Model& model() const { return model_; }

 private:
  const Model& model_;
  SessionOptions opts_;
  ThreadPool pool_;
  KvCache cache_;
  std::unique_ptr<RecurrentState> state_;  // hybrid models only
  int64_t n_past_ = 0;
  std::vector<float> logits_;
};

}  // namespace xpert
