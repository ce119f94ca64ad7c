// How often the router of each MoE layer picks each expert: the data that decides which experts live on
// the GPU (runtime/experts/plan.h). Counted by the backends' MoE ops (a RoutingSink) when a forward pass's
// ForwardArgs carries a RoutingStats; written by `xpert profile` as JSON next to the model
// (`<model>.xpert-profile.json`), together with the model's identity so a profile is never applied to a
// different model.
//
// Counters are relaxed atomics: the engine thread adds while another thread (metrics, a rebalancer) may
// read a snapshot; a snapshot taken during a pass can be a few tokens behind.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/experts.h"

namespace xpert {

class Model;

// What a profile must match: the same architecture, layer and expert counts, and the same file (by size:
// a requantized file routes differently).
struct ModelIdentity {
  std::string arch = "", name = "";
  int64_t n_layer = 0, n_expert = 0, n_expert_used = 0;
  uint64_t file_bytes = 0;
  static ModelIdentity of(const Model& m);
};

class RoutingStats final : public RoutingSink {
 public:
  RoutingStats(int64_t n_layer, int64_t n_expert, int64_t n_expert_used);
  explicit RoutingStats(const Model& m);
  RoutingStats(const RoutingStats& o);
  RoutingStats& operator=(const RoutingStats& o);

  int64_t n_layer() const { return n_layer_; }
  int64_t n_expert() const { return n_expert_; }
  int64_t n_expert_used() const { return k_; }

  // One count per routed (token, slot) of layer il: ids as Routing::ids (n_tokens * k values).
  void add(int64_t il, std::span<const int32_t> ids) override;
  void set(int64_t il, int64_t e, uint64_t count);
  void reset();

  uint64_t count(int64_t il, int64_t e) const;
  std::vector<uint64_t> layer_counts(int64_t il) const;
  uint64_t layer_total(int64_t il) const;  // routings counted in layer il (tokens * k)
  uint64_t max_tokens() const;             // tokens seen by the most-counted layer
  bool empty() const { return max_tokens() == 0; }

  // Experts of layer il, most routed first (ties: the lower index first).
  std::vector<int32_t> ranked(int64_t il) const;
  // Share of layer il's routings that its `top` most routed experts take (0 when nothing was counted).
  double top_share(int64_t il, int64_t top) const;

  // JSON: {"format": "xpert-routing-profile", "version": 1, "model": {identity}, "tokens": N,
  // "counts": [[layer 0's n_expert counts], ...]}. save writes a temporary file and renames it.
  void save(const std::string& path, const ModelIdentity& id) const;
  // Throws Error when the file is unreadable or malformed, or was recorded on another model (names the
  // field that differs and what to do).
  static RoutingStats load(const std::string& path, const ModelIdentity& expect);

  // `<model>.xpert-profile.json` (a folder's trailing slash dropped).
  static std::string default_path(const std::string& model_path);

 private:
  int64_t n_layer_ = 0, n_expert_ = 0, k_ = 0;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // [n_layer][n_expert]
};

}  // namespace xpert
