// One sequence being evaluated: the model, its KV cache (and recurrent state, for hybrid models), the
// thread pool and the position reached.
// eval() appends tokens (prefilled in chunks of n_batch) and returns the logits of the last one.
// For hybrid models it keeps checkpoints of the recurrent state (every checkpoint_every positions and
// wherever checkpoint() is called, within cache_ram_bytes) so truncate() can go back to them.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "model/model.h"
#include "model/kv_cache.h"
#include "runtime/pinned_floats.h"
#include "model/recurrent_state.h"

namespace xpert {

class RoutingStats;

struct SessionOptions {
  int64_t n_ctx = 4096;   // 0: the model's trained context
  int n_threads = 0;      // 0: physical cores
  int64_t n_batch = 512;  // prefill chunk
  // Hybrid models: memory for recurrent checkpoints (0: none), and one every this many positions (0:
  // only where checkpoint() is called).
  size_t cache_ram_bytes = 0;
  int64_t checkpoint_every = 0;
  KvTypes cache_types = {};  // --cache-type-k / --cache-type-v
  RoutingStats* routing_stats = nullptr;  // MoE models: count every pass's expert choices here (may be null)
};

class Session {
 public:
  Session(const Model& model, const SessionOptions& opts);
  const std::vector<float>& eval(std::span<const int32_t> tokens);
  int64_t n_past() const { return n_past_; }
  int64_t n_ctx() const { return cache_.n_ctx(); }
  void reset();
  // Keeps at most the first n tokens and drops the rest; returns how many it kept, where the next eval()
  // continues. The KV cache can always be cut (returns n); a recurrent state cannot be rolled back, so
  // for hybrid models a cut below n_past() goes back to the nearest checkpoint at or below n (0 when
  // there is none): the caller evaluates its tokens from there.
  int64_t truncate(int64_t n);
  // Hybrid models: saves the recurrent state at n_past() for truncate() (a no-op for other models, when
  // cache_ram_bytes is 0, or when one is there already). Evicts the least recently used to stay within
  // cache_ram_bytes.
  void checkpoint();
  size_t n_checkpoints() const { return checkpoints_.size(); }
  ThreadPool& pool() { return pool_; }
  const Model& model() const { return model_; }

 private:
  const Model& model_;
  SessionOptions opts_;
  ThreadPool pool_;
  KvCache cache_;
  std::unique_ptr<RecurrentState> state_;  // hybrid models only
  struct Checkpoint {
    int64_t pos = 0;
    std::vector<float> state;  // save_recurrent()
    uint64_t used = 0;
  };
  std::vector<Checkpoint> checkpoints_;  // on the tokens evaluated so far, at positions <= n_past_
  uint64_t clock_ = 0;
  int64_t n_past_ = 0;
  PinnedFloats logits_;  // registered with the model's offload device, where it does that
};

}  // namespace xpert
