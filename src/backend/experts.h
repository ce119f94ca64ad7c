// What a MoE op takes: one layer's routed-experts FFN as shapes and weights (MoeFfn), with the optional
// pieces of heterogeneous experts — which experts a device holds (ExpertSplit), a device that computes
// the host's experts (ExpertExecutor), and where the routing is counted (RoutingSink). The plan that fills
// them, the executors' setup, rebalancing and the statistics live in runtime/experts/.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/tensor.h"

namespace xpert {

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
  // Nonzero: a speed-measurement mode (`xpert bench --routing uniform`). Each logit l of expert e is
  // replaced by uniform_route_score(l, e, seed) (backend/uniform_routing.h) before the softmax and top-k,
  // so each token's k experts are a uniformly random choice, deterministic in the seed and the logits.
  uint32_t uniform_seed = 0;
};

// The experts of a MoE layer split between a GPU and the host (heterogeneous experts): experts with
// on_device[e] have their three matrices in the GPU's memory (gate/up/down[e]); the others are read in
// place from the host's mmap through host_gate/up/down (the layer's 3-D tensors in host memory).
struct ExpertSplit {
  std::vector<bool> on_device;
  std::vector<const void*> gate, up, down;  // per expert: device pointer, null when on the host
  Weight host_gate, host_up, host_down;
  int64_t n_on_device() const {
    int64_t n = 0;
    for (bool b : on_device) n += b;
    return n;
  }
};

// A device that computes host experts (an OpenCL device, --expert-device opencl:N): the CPU routes,
// gathers and combines; the device computes the (expert, rows) tasks it is given, asynchronously, so the
// CPU's threads compute other experts of the same batch meanwhile (--expert-device opencl:N,cpu).
struct ExpertTask {
  int32_t expert = 0, row0 = 0, n_rows = 0;  // grouped rows [row0, row0 + n_rows) go through `expert`
};
struct MoeFfn;
class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  virtual std::string name() const = 0;
  // Starts yg[i] = SwiGLU expert of row i (xg[i]) for the rows of every task; xg, yg: [n_rows][n_embd],
  // valid (and yg unread) until wait() returns. One start is in flight at a time.
  virtual void start(const MoeFfn& m, std::span<const ExpertTask> tasks, const float* xg, int64_t n_rows,
                     float* yg) = 0;
  // Returns once the last start's yg is written; throws Error when the device failed.
  virtual void wait() = 0;
  void run(const MoeFfn& m, std::span<const ExpertTask> tasks, const float* xg, int64_t n_rows, float* yg) {
    start(m, tasks, xg, n_rows, yg);
    wait();
  }
};

// How a layer's host experts are shared between its ExpertExecutor and the CPU's threads: the executor
// takes this fraction of a batch's expert rows (0: the CPU alone; 1: the executor alone), one share for
// decode-sized batches and one for prefill. runtime/experts/executor_share.h measures them per machine.
struct ExecutorShare {
  double decode = 1.0, prefill = 1.0;
  int64_t prefill_min_tokens = 16;  // batches of at least this many tokens take `prefill`
  double of(int64_t n_tokens) const { return n_tokens >= prefill_min_tokens ? prefill : decode; }
};

// Where a MoE op reports each batch's routing (runtime/experts/routing_stats.h counts it).
class RoutingSink {
 public:
  // ids: Routing::ids of layer `layer`'s batch (n_tokens * k values).
  virtual void add(int64_t layer, std::span<const int32_t> ids) = 0;

 protected:
  ~RoutingSink() = default;
};

// One layer's routed-experts FFN (router, softmax top-k, SwiGLU experts, weighted sum), as the ops take
// it: x [n][n_embd] -> [n][n_embd].
struct MoeFfn {
  int64_t n_embd = 0, n_ff = 0;       // n_ff: one expert's FFN length
  int64_t n_expert = 0, n_used = 0;   // top n_used of n_expert
  bool norm_weights = true;           // renormalize the chosen experts' weights to sum 1
  float weights_scale = 1.0f;         // then multiply them by this
  float rms_eps = 1e-6f;              // of the norms fused around it (add_rmsnorm_moe_ffn_add)
  Weight router;                      // [n_embd, n_expert]
  Weight gate, up, down;              // experts: gate/up [n_embd, n_ff, n_expert], down [n_ff, n_embd, n_expert]
  // A sigmoid-gated shared expert (Qwen3.5), n_ff_shared 0: none. gate_inp [n_embd]; SwiGLU of n_ff_shared.
  int64_t n_ff_shared = 0;
  Weight shared_gate_inp, shared_gate, shared_up, shared_down;
  const ExpertSplit* split = nullptr;  // some experts not on the executing device (its weights: split's)
  // The host experts (every expert of a host layer, the host share of a split one): computed by exec for
  // exec_share of their rows, by the CPU's threads for the rest (exec null: the CPU alone).
  ExpertExecutor* exec = nullptr;
  ExecutorShare exec_share;
  int64_t layer = -1;                  // the model layer: executors' tables, routing statistics
  RoutingSink* stats = nullptr;        // counts the routing when set
  uint32_t uniform_seed = 0;           // RouterParams::uniform_seed

  RouterParams router_params() const {
    return {.n_expert = n_expert,
            .k = n_used,
            .norm_weights = norm_weights,
            .weights_scale = weights_scale,
            .uniform_seed = uniform_seed};
  }
  // The same layer with the host's copies of its experts (a split layer's host share).
  MoeFfn host_view() const {
    MoeFfn h = *this;
    h.gate = split->host_gate;
    h.up = split->host_up;
    h.down = split->host_down;
    h.split = nullptr;
    return h;
  }
};

}  // namespace xpert
