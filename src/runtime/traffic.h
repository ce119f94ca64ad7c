// The bandwidth roofline `xpert bench` reports (issue #7's measure): the bytes a step moves through memory,
// from the model's tensor sizes (runtime/experts/plan.h's ModelBytes), and a copy's measured bandwidth on the
// device that holds the layers. A step cannot finish faster than its bytes at that bandwidth; the fraction
// of it a test reaches says how far a kernel is from the memory system's limit.
//   decoded token: every layer's weights but its routed experts, n_expert_used of those (shared experts
//                  are in the layer's own bytes), the output norm and head, one embedding row; the KV rows
//                  up to its position in every attention layer; each recurrent layer's state, read and
//                  written.
//   prefill pass:  every weight once (n tokens of k slots touch min(n k, n_expert) experts a layer), n
//                  embedding rows, and the KV rows up to the pass's end once a layer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/model.h"
#include "model/kv_cache.h"

namespace xpert {

class Backend;
class ThreadPool;

struct StepTraffic {
  double dense = 0;   // bytes of every layer's weights but its routed experts, plus output norm and head
  double expert = 0;  // one routed expert of every MoE layer, summed over the layers
  double embedding_row = 0;
  int64_t n_expert = 0, n_expert_used = 0;
  double kv_per_position = 0;         // K and V bytes of one position, all full-attention layers
  double kv_window_per_position = 0;  // the same for the sliding-window layers, which read at most `window`
  int64_t window = 0;
  double state = 0;  // the recurrent layers' states, one sequence
  // A decoded token at context length ctx (positions 0..ctx-1 read).
  double decode_bytes(double ctx) const;
  // A prefill pass of n tokens that ends at context length ctx.
  double prefill_bytes(int64_t n, double ctx) const;
  static StepTraffic of(const Model& m, KvTypes types);
};

// Bytes a copy within `device` moves each second (read + write), timed over a few copies of a buffer well
// past the caches; null: the host's memory, copied by `pool`'s threads. Throws Error when the buffers do not
// fit.
double copy_bandwidth(Backend* device, ThreadPool& pool);

}  // namespace xpert
