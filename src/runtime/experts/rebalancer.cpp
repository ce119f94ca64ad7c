#include "runtime/experts/rebalancer.h"

#include <algorithm>
#include <chrono>

#include "backend/backend.h"
#include "base/error.h"
#include "base/log.h"
#include "model/model.h"
#include "runtime/experts/routing_stats.h"

namespace xpert {

ExpertRebalancer::ExpertRebalancer(Model& model, const ExpertRebalancerOptions& o) : model_(model), o_(o) {
  if (!model.splits_experts())
    fail("no GPU layer keeps experts on the host, so no expert can move (rebalancing needs -ngl with "
         "--num-gpu-experts or --gpu-expert-budget below the layers' experts)");
  o_.every_tokens = std::max<int64_t>(1, o_.every_tokens);
  o_.decay = std::clamp(o_.decay, 0.0, 1.0);
  const ModelConfig& c = model.config();
  seen_.resize(c.n_layer);
  window_.resize(c.n_layer);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    if (!model.expert_split(il)) continue;
    seen_[il].assign(c.n_expert, 0);
    window_[il].assign(c.n_expert, 0.0);
  }
}

void ExpertRebalancer::after_pass(int64_t n_tokens, const RoutingStats& live) {
  since_ += n_tokens;
  if (since_ < o_.every_tokens) return;
  since_ = 0;
  round(live);
}

ExpertRebalancer::Round ExpertRebalancer::round(const RoutingStats& live) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = model_.config();
  XP_ASSERT(live.n_layer() == c.n_layer && live.n_expert() == c.n_expert);
  std::vector<std::vector<bool>> resident(c.n_layer);
  double window_tokens = 0;
  for (int64_t il = 0; il < c.n_layer; ++il) {
    if (window_[il].empty()) continue;
    resident[il] = model_.expert_split(il)->on_device;
    double layer = 0;
    for (int64_t e = 0; e < c.n_expert; ++e) {
      const uint64_t now = live.count(il, e);  // relaxed counters: never behind what was read before
      window_[il][e] = window_[il][e] * o_.decay + (double)(now - seen_[il][e]);
      seen_[il][e] = now;
      layer += window_[il][e];
    }
    window_tokens = std::max(window_tokens, layer / (double)std::max<int64_t>(1, c.n_expert_used));
  }
  Round r;
  r.plan = plan_rebalance(resident, window_, o_.plan);
  r.bytes = model_.move_experts(r.plan.moves);
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t n_round = rounds_.fetch_add(1, std::memory_order_relaxed) + 1;
  moves_.fetch_add(r.plan.moves.size(), std::memory_order_relaxed);
  bytes_.fetch_add(r.bytes, std::memory_order_relaxed);
  if (r.plan.moves.empty()) {
    log::debug("rebalance {}: no expert moved (window of {:.0f} tokens; GPU share of split layers' routings {:.1f}%)",
               n_round, window_tokens, 100.0 * std::max(0.0, r.plan.gpu_share_before));
  } else {
    log::info("rebalance {}: {} experts moved in {} layers ({} copied to {} in {:.1f} ms); GPU share of the split "
              "layers' routings {:.1f}% -> {:.1f}% (window of {:.0f} tokens)",
              n_round, r.plan.moves.size(), r.plan.n_layers, format_bytes((double)r.bytes),
              model_.offload_device()->name(), r.ms, 100.0 * r.plan.gpu_share_before,
              100.0 * r.plan.gpu_share_after, window_tokens);
  }
  return r;
}

}  // namespace xpert
