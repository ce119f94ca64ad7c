// Rebalancing experts while serving (`xpert serve --rebalance-experts N`, issue #8): every N tokens the
// engine forwards, the experts of split GPU layers (some experts on the GPU, the rest on the host) are
// re-chosen from the routing counted since the start: host experts that are now routed clearly more than
// resident ones are copied over them (runtime/experts/plan.h `plan_rebalance`, Model::move_experts).
//
// The counts a round plans on are a decayed window of the engine's live RoutingStats: each round adds
// what was counted since the last one to the previous window times `decay`, so a change of traffic is
// followed within a few rounds while one round's noise is damped (and the hysteresis ignores the rest).
// The placement at start (by the --expert-profile, or by index) is where this starts from.
//
// Runs on the engine's thread between forward passes (Engine calls after_pass), the one point where no
// pass reads the layers' weights.
#pragma once
#include <atomic>
#include <cstdint>
#include <vector>

#include "runtime/experts/plan.h"

namespace xpert {

class Model;
class RoutingStats;

struct ExpertRebalancerOptions {
  int64_t every_tokens = 1024;  // a round after this many forwarded tokens (prompt and generated)
  double decay = 0.5;           // weight of the previous window in the next one (0: the last period only)
  RebalanceOptions plan = {};
};

class ExpertRebalancer {
 public:
  // Throws Error when no layer of the model is split (nothing could move).
  ExpertRebalancer(Model& model, const ExpertRebalancerOptions& o);

  // After each forward pass, with the tokens it forwarded: runs a round when every_tokens have passed.
  void after_pass(int64_t n_tokens, const RoutingStats& live);

  struct Round {
    RebalancePlan plan;
    size_t bytes = 0;  // copied to the GPU
    double ms = 0;
  };
  // One round now: updates the window from `live`, plans, moves and logs a line. Returns what it did.
  Round round(const RoutingStats& live);

  // Counters for /metrics (read from other threads).
  uint64_t moves_total() const { return moves_.load(std::memory_order_relaxed); }
  uint64_t rounds_total() const { return rounds_.load(std::memory_order_relaxed); }
  uint64_t bytes_total() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  Model& model_;
  ExpertRebalancerOptions o_;
  int64_t since_ = 0;                        // tokens forwarded since the last round
  std::vector<std::vector<uint64_t>> seen_;  // [layer][expert]: live counts at the last round
  std::vector<std::vector<double>> window_;  // [layer][expert]: decayed counts (empty rows: not split)
  std::atomic<uint64_t> moves_{0}, rounds_{0}, bytes_{0};
};

}  // namespace xpert
