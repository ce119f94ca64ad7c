// The placement plan of a MoE model: which layers run on the GPU (-ngl: the last N, llama.cpp's meaning)
// and, inside each of those layers, which routed experts are resident in GPU memory; every other expert
// runs on the expert device (`--expert-device`, the CPU for now) from the host's copy (the mmap).
//
// How many experts: `--num-gpu-experts N` per offloaded MoE layer (KTransformers' --kt-num-gpu-experts),
// or `--gpu-expert-budget SIZE` bytes over all offloaded layers, or (neither) all of them.
// Which experts: by routing frequency when a profile (runtime/experts/routing_stats.h) is there, else by index.
// A budget is filled globally: decode is bandwidth-bound and layers run one after another, so the time
// the host spends per token is the bytes of host experts it reads, Σ over layers and host experts of
// P(expert routed) × its bytes; taking (layer, expert) pairs by P / bytes until the budget is spent
// minimizes that sum (exactly when experts are equal in size, as a greedy knapsack otherwise). Without a
// profile every P is the same, so the budget goes round-robin over the layers in index order (expert 0
// of every layer, then expert 1, ...): equal counts per layer, as --num-gpu-experts would give.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace xpert {

class RoutingStats;

// What the planner needs to know about a model's weights.
struct LayerBytes {
  size_t dense = 0;   // everything of the layer but its routed experts (attention or DeltaNet, norms, router,
                      // shared expert)
  size_t expert = 0;  // one routed expert: its gate, up and down slices (0: the layer has none)
};
struct ModelBytes {
  std::vector<LayerBytes> layers;
  size_t embedding = 0;  // the token embedding: read on the host always
  size_t output = 0;     // output norm + head (the embedding again when tied): on the GPU with any offload
  static ModelBytes of(const Model& m);
};

enum class ExpertChoice { all, index, frequency };
const char* expert_choice_name(ExpertChoice c);

struct ExpertPlanOptions {
  int64_t n_gpu_layers = 0;              // the last N layers on the GPU, 0..n_layer (already resolved)
  int64_t num_gpu_experts = -1;          // per offloaded MoE layer; -1: not given
  int64_t gpu_expert_budget_bytes = -1;  // routed experts on the GPU over all offloaded layers; -1: not given
  const RoutingStats* profile = nullptr;  // routing counts (identity already checked); null: index order
  std::string profile_path = "";          // for the summary
  std::string gpu = "cuda:0";             // names in the summary and errors
  std::string expert_device = "cpu";
  size_t gpu_free_bytes = 0;   // 0: unknown, no check
  size_t gpu_extra_bytes = 0;  // what else the GPU must hold (KV cache, scratch), counted in the check
  bool gpu_weights_in_place = false;  // the device reads weights from host memory (reads_host_weights)
};

struct ExpertPlan {
  int64_t n_layer = 0, n_expert = 0;
  int64_t first_gpu_layer = 0;  // layers [first_gpu_layer, n_layer) run on the GPU; n_layer: none
  ExpertChoice choice = ExpertChoice::all;
  std::string gpu, expert_device, profile_path;
  uint64_t profile_tokens = 0;
  // [n_layer][n_expert]: routed expert e of layer il is resident on the GPU (false for every host layer).
  std::vector<std::vector<bool>> gpu_experts;
  std::vector<size_t> expert_bytes;  // [n_layer]: one routed expert's gate + up + down (0: no experts)
  std::vector<double>
      layer_gpu_share;  // [n_layer]: share of its routings served on the GPU (-1: unknown / host layer)

  // Bytes per device. GPU: what Model::offload uploads (dense weights of the offloaded layers, their
  // resident experts, the output head whenever a layer is) + gpu_extra_bytes. Host: the rest,
  // read in place from the file (embedding, host layers, every expert not resident on the GPU).
  size_t gpu_dense_bytes = 0, gpu_expert_bytes = 0, gpu_output_bytes = 0, gpu_extra_bytes = 0;
  size_t gpu_free_bytes = 0;  // 0: unknown
  // The device reads its weights in place from host memory (Backend::reads_host_weights): they take none of
  // its memory (the check counts gpu_extra_bytes alone), and they are the host's mapped pages.
  bool gpu_weights_in_place = false;
  size_t host_bytes = 0, host_expert_bytes = 0;
  // Of the offloaded MoE layers' routings, the share served by resident experts: measured on the profile,
  // or n_gpu / n_expert (uniform routing) without one. -1: no offloaded MoE layer.
  double gpu_routing_share = -1;
  // Expected bytes of host experts read per decoded token (batch 1): Σ P(routed) × bytes over host experts.
  double host_expert_bytes_per_token = 0;

  bool layer_on_gpu(int64_t il) const { return il >= first_gpu_layer; }
  bool moe_layer(int64_t il) const { return expert_bytes[il] > 0; }
  bool expert_on_gpu(int64_t il, int64_t e) const { return gpu_experts[il][e]; }
  int64_t n_gpu_experts(int64_t il) const;
  // Some offloaded MoE layer keeps experts on the expert device: the GPU backend must run it split.
  bool splits_experts() const;
  // Room for one layer's host experts copied to the GPU (prefill batches and the decode share stream
  // them): when a GPU layer keeps experts on the host.
  size_t gpu_stream_bytes = 0;
  size_t gpu_bytes() const {
    return gpu_dense_bytes + gpu_expert_bytes + gpu_output_bytes + gpu_stream_bytes + gpu_extra_bytes;
  }
  // For `xpert info` and start-up logs; per_layer adds one line per offloaded MoE layer.
  std::string summary(bool per_layer = false) const;
};

// Throws Error for contradictory or impossible options (both counts given, more experts than the model
// has, experts asked of a model without experts or of no GPU layer) and for a plan that does not fit
// gpu_free_bytes (saying what would fit).
ExpertPlan plan_experts(const ModelConfig& c, const ModelBytes& bytes, const ExpertPlanOptions& o);

// Rebalancing while serving (runtime/experts/rebalancer.h): swaps between the GPU and the host inside
// split layers, one admitted expert for one evicted, so each layer keeps its resident count (GPU memory
// unchanged, the evicted expert's buffers reused).
struct RebalanceOptions {
  int64_t max_moves_per_layer = 4;  // bounds a round's copy time, and how far one burst of traffic moves
  // Hysteresis: a swap is made only when the admitted expert's share of the layer's routings exceeds the
  // evicted one's by min_gain x the uniform share (1 / n_expert), and by min_z standard deviations of
  // the two counts' noise (as Poisson counts: sqrt(a + b)): flat or thinly counted routing moves nothing.
  double min_gain = 0.5;
  double min_z = 3.0;
};
struct RebalancePlan {
  std::vector<ExpertMove> moves;  // layer by layer; in a layer, the most routed admitted expert first
  int64_t n_layers = 0;           // layers with moves
  // Of the split layers' counted routings, the share served by resident experts before and after the
  // moves (-1: nothing counted).
  double gpu_share_before = -1, gpu_share_after = -1;
};
// resident[il]: which experts of layer il are on the GPU (empty: not a split layer, left alone);
// counts[il][e]: how often expert e was routed (raw or decayed counts: any non-negative weights; an
// empty row counts nothing). Per layer, the most routed host experts are paired with the least routed
// resident ones until a pair falls short of the hysteresis or max_moves_per_layer is reached.
// Deterministic: ties go to the lower index for admission and to the higher index for eviction.
RebalancePlan plan_rebalance(const std::vector<std::vector<bool>>& resident,
                             const std::vector<std::vector<double>>& counts, const RebalanceOptions& o);

// "12GiB", "800MiB", "1.5G", "4096": binary units K/KiB M/MiB G/GiB T/TiB (and bare K M G T), decimal
// KB MB GB TB, optional B, case-insensitive; a plain number is bytes. Throws Error naming the flag.
uint64_t parse_bytes(const std::string& s, const char* what = "size");

std::string format_bytes(double bytes);  // "1.23 GiB", "800.0 MiB", "512 B"

}  // namespace xpert
