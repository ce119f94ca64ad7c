// The routed-experts FFN of a Mixture-of-Experts layer, as llama.cpp's build_moe_ffn computes it for
// qwen3moe: router logits -> softmax over all experts -> top-k -> the k probabilities renormalized to
// sum 1 (optionally scaled) -> SwiGLU experts -> weighted sum in rank order.
//
// A batch runs grouped by expert: the rows routed to an expert are gathered, multiplied by that
// expert's weights once (m = rows routed to it), and the weighted results summed per token. An expert
// is always addressed as a slice ("matrix e of the layer's 3-D tensor"), never the whole tensor, so a
// placement can later put experts one by one on different devices.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "model/model.h"

namespace xpert {

class RoutingStats;

// Top-k choice of each token: slot j of token t is expert ids[t*k + j] with weight weights[t*k + j],
// slots in descending probability (ties: the lower expert index first).
struct Routing {
  int64_t n_tokens = 0, k = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

struct RouterParams {
  int64_t n_expert = 0, k = 0;
  bool norm_weights = true;   // divide the k probabilities by their sum
  float weights_scale = 1.0f; // then multiply by this
};

// logits: [n_tokens][n_expert].
void route_top_k(const float* logits, int64_t n_tokens, const RouterParams& p, Routing& r);

// Expert e of a 3-D expert tensor [k, n, n_expert] as a 2-D weight [k, n] (a view into the same bytes).
Weight expert_matrix(const Weight& exps, int64_t e);

// How the experts of one batch share the threads. by_expert: each thread runs whole experts (taken
// from a shared queue) with a single-threaded matmul, no synchronization between experts: the choice
// when many experts get few rows each (decode). by_rows: experts one after another, each matmul split
// over all threads: the choice when a few experts get most rows. batched: the gate and up products of
// every expert in one parallel region, then every down product in another, each thread streaming an
// equal share of the weight bytes: the choice when each expert has few rows (decode, with fewer
// experts than threads twice over). automatic picks per batch.
enum class MoeSchedule { automatic, by_expert, by_rows, batched };

// Reusable buffers of one MoE evaluation.
struct MoeScratch {
  std::vector<float> logits;         // [n][n_expert]
  Routing routing;
  std::vector<int32_t> offsets;      // [n_expert + 1]: expert e's rows are [offsets[e], offsets[e+1])
  std::vector<int32_t> row_slot;     // grouped row -> slot (t*k + j)
  std::vector<int32_t> slot_row;     // slot -> grouped row
  std::vector<float> xg, gate, up, yg;  // grouped rows: [n*k][n_embd], [n*k][n_ff_exp] x2, [n*k][n_embd]
};

// x: [n][n_embd] (the normalized FFN input) -> out: [n][n_embd]. Uses c.n_embd, n_expert,
// n_expert_used, n_ff_exp, expert_weights_norm/scale and lw.ffn_gate_inp, ffn_{gate,up,down}_exps.
// Adds the routing to routing_tap() when it has stats. = moe_route, then moe_experts_partial of all.
void moe_ffn(const ModelConfig& c, const LayerWeights& lw, const float* x, int64_t n, float* out, MoeScratch& s,
             ThreadPool& pool, MoeSchedule schedule = MoeSchedule::automatic);

// The router alone: logits = x . ffn_gate_inp, then route_top_k with the layer's parameters into r.
void moe_route(const ModelConfig& c, const LayerWeights& lw, const float* x, int64_t n, Routing& r, MoeScratch& s,
               ThreadPool& pool);
RouterParams moe_router_params(const ModelConfig& c);

// Heterogeneous experts: only the experts with include[e] (include.size() == n_expert) for a routing
// computed elsewhere (r: n tokens, k = n_expert_used). For every (token, slot) whose expert is included,
// the SwiGLU expert output times the slot's weight, added per token in slot order:
//   accumulate = false: out[t] = sum over the included slots (0 for a token with none),
//   accumulate = true:  out[t] += each included slot's term, one after another in slot order.
// Rows are grouped by expert exactly as in moe_ffn (each included expert's weights read once per batch,
// the same rows in the same order), so its expert outputs are moe_ffn's bits, and a full include set
// reproduces moe_ffn bit for bit. Two parts (the first out=, the second accumulate) equal moe_ffn
// exactly when each token's first-part slots come before its second-part slots, and always for k <= 2
// (float addition is commutative); otherwise up to summation order. Expert weights are read through
// expert_matrix, so lw may be the host's view (the mmap) of a layer whose other experts are elsewhere.
void moe_experts_partial(const ModelConfig& c, const LayerWeights& lw, const float* x, int64_t n, const Routing& r,
                         const std::vector<bool>& include, float* out, bool accumulate, MoeScratch& s,
                         ThreadPool& pool, MoeSchedule schedule = MoeSchedule::automatic);

// Routing statistics of the forward pass running on this thread: Exec sets it from
// ForwardArgs::routing_stats (stats null when the pass records nothing) and the layer it enters; moe_ffn
// adds its routing there. A thread-local because Backend::moe_ffn carries no per-pass context.
struct RoutingTap {
  RoutingStats* stats = nullptr;
  int64_t layer = -1;
};
RoutingTap& routing_tap();

// A device that computes the experts of host-resident MoE layers (an OpenCL device, --expert-device
// opencl:N): the CPU routes and combines; run() computes every routed (expert, row) of a batch.
struct ExpertTask {
  int32_t expert = 0, row0 = 0, n_rows = 0;  // grouped rows [row0, row0 + n_rows) go through `expert`
};
class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  virtual std::string name() const = 0;
  // yg[i] = SwiGLU expert of row i (xg[i]), for the rows of every task; xg, yg: [n_rows][n_embd].
  virtual void run(int64_t layer, const LayerWeights& lw, std::span<const ExpertTask> tasks, const float* xg,
                   int64_t n_rows, float* yg) = 0;
};

// moe_ffn with the experts computed by `exec` (layer: the model layer, for the executor's weight tables).
void moe_ffn_on(ExpertExecutor& exec, int64_t layer, const ModelConfig& c, const LayerWeights& lw, const float* x,
                int64_t n, float* out, MoeScratch& s, ThreadPool& pool);

// The obvious version for tests: token by token, slot by slot, with cpu::matmul_reference.
void moe_ffn_reference(const ModelConfig& c, const LayerWeights& lw, const float* x, int64_t n, float* out);

}  // namespace xpert
