// The memory plan: what a run will hold on each device (weights, KV cache, recurrent states, the state
// cache's budget, scratch), computed before any weight is read or uploaded from the model's config, its
// tensor sizes (GGUF header) and the placement (runtime/experts/plan.h). Printed at start; check() refuses a
// configuration that cannot fit, naming the flags that would make it fit.
//
// Host RAM: weights are mapped from the file and read in place. Their pages are page cache, which the
// kernel can drop and read again, so they do not count against MemAvailable (which already counts such
// pages as reclaimable); only what is allocated (KV cache and recurrent states of host layers, the state
// cache budget, scratch) must fit in it. When weights + allocations exceed MemAvailable the plan fits but
// weights will be re-read from disk: a warning, not an error.
// GPU: everything on it is allocated (uploaded weights included) and must fit its free memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "runtime/experts/plan.h"
#include "model/model.h"
#include "model/kv_cache.h"

namespace xpert {

// The context -c asks for: `-c 0` is the model's trained maximum; a request above it is an Error naming
// the maximum. `requested` < 0 means "not given": 4096, or the trained maximum when that is less.
int64_t resolve_ctx_flag(const ModelConfig& c, int64_t requested);

struct MemoryPlanOptions {
  int64_t n_ctx = 4096;        // per slot, already resolved
  int n_parallel = 1;          // cache slots (serve --parallel; 1 for run, chat, bench)
  int64_t n_batch = 512;       // tokens evaluated per step: sizes the scratch
  size_t cache_ram_bytes = 0;  // --cache-ram: the state cache's budget (host), 0: none
  bool weights_mapped = true;  // weights read in place from a file mapping (page cache)
  // All tensors' bytes: the host's mapped weights are at most this (a head tied to the embedding is
  // mapped once, though the placement counts it twice). 0: unknown.
  size_t file_weight_bytes = 0;
  size_t host_available = 0;   // MemAvailable; 0: unknown, no host check
  KvTypes cache_types = {};    // --cache-type-k / --cache-type-v
};

struct DeviceMemory {
  std::string name;  // "host" or "cuda:N"
  size_t weights = 0, kv = 0, recurrent = 0, state_cache = 0, scratch = 0;
  bool weights_mapped = false;  // weights are page cache (host, mapped file), not allocations
  size_t available = 0;         // MemAvailable / the GPU's free memory; 0: unknown
  size_t total() const { return weights + kv + recurrent + state_cache + scratch; }
  // What must fit in `available`: everything but mapped weights.
  size_t allocated() const { return total() - (weights_mapped ? weights : 0); }
};

struct MemoryPlan {
  int64_t n_ctx = 0, n_ctx_train = 0, n_batch = 0;
  int n_parallel = 1;
  KvTypes cache_types;
  DeviceMemory host;
  std::optional<DeviceMemory> gpu;  // when some layer is offloaded
  // One line per device, for start-up logs and `xpert info`.
  std::string summary() const;
  // Throws Error when a device's needs exceed what it has, saying what to change (-c, --parallel, -ngl,
  // --cache-ram). Returns a warning ("" when none): mapped weights that will not stay in RAM.
  std::string check() const;
};

// KV cache: per attention layer n_ctx × n_parallel × (K row + V row bytes), a row being n_head_kv × head_dim
// values in the cache type: 2 bytes each for f16, 34 per 32 for q8_0, 18 per 32 for q4_0.
size_t kv_bytes_per_layer(const ModelConfig& c, int64_t n_ctx, int n_parallel, KvTypes types = {});
// GPU prefill over a q8_0 / q4_0 cache reads an f16 copy of the layer's rows 0..n_kv (cuda/attention.h):
// n_ctx × n_head_kv × head_dim × 2 bytes per quantized side, added to the GPU's scratch.
size_t kv_prefill_copy_bytes(const ModelConfig& c, int64_t n_ctx, KvTypes types);
// Recurrent state: per recurrent layer and slot, (conv state + delta-rule state) × 4 bytes.
size_t recurrent_bytes_per_layer(const ModelConfig& c, int n_parallel);
// Scratch (an estimate of the activations of one step of n_batch tokens, fp32):
//   4 B × (n_batch × (4·n_embd + 2·n_head·head_dim + 2·n_head_kv·head_dim + 3·n_ff_eff + 2·conv_dim)
//          + n_parallel × n_vocab)
// n_ff_eff = max(n_ff, n_expert_used × n_ff_exp); conv_dim: the DeltaNet q|k|v channels (0 if none); the
// logits are of each sequence's last token only. Counted once, on the device the layers run on (the GPU
// when any layer is offloaded).
size_t scratch_bytes(const ModelConfig& c, int64_t n_batch, int n_parallel = 1);

MemoryPlan plan_memory(const ModelConfig& c, const ExpertPlan& placement, const MemoryPlanOptions& o);

// MemAvailable from /proc/meminfo in bytes; 0 when unknown.
size_t host_available_memory();

}  // namespace xpert
