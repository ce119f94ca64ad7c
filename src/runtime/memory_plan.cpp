#include "runtime/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "model/recurrent_state.h"

namespace xpert {

namespace {

std::string parts(const DeviceMemory& d) {
  std::string s = fmt::format("weights {}{}", format_bytes((double)d.weights), d.weights_mapped ? " (mapped)" : "");
  if (d.kv) s += fmt::format(" + KV cache {}", format_bytes((double)d.kv));
  if (d.recurrent) s += fmt::format(" + recurrent states {}", format_bytes((double)d.recurrent));
  if (d.state_cache) s += fmt::format(" + state cache up to {}", format_bytes((double)d.state_cache));
  if (d.scratch) s += fmt::format(" + scratch {}", format_bytes((double)d.scratch));
  return s;
}

}  // namespace

int64_t resolve_ctx_flag(const ModelConfig& c, int64_t requested) {
  const int64_t train = c.n_ctx_train;
  if (requested < 0) return train > 0 ? std::min<int64_t>(4096, train) : 4096;
  if (requested == 0) {
    if (train <= 0) fail("-c 0 asks for the model's trained context, but the model does not state one; give -c N");
    return train;
  }
  if (train > 0 && requested > train)
    fail("-c {} is above the model's trained context of {} tokens; use -c {} or less (-c 0: the trained maximum)",
         requested, train, train);
  return requested;
}

size_t kv_bytes_per_layer(const ModelConfig& c, int64_t n_ctx, int n_parallel, KvTypes types) {
  return (size_t)n_ctx * (size_t)n_parallel * (kv_row_bytes(c, types.k) + kv_row_bytes(c, types.v));
}

size_t kv_prefill_copy_bytes(const ModelConfig& c, int64_t n_ctx, KvTypes types) {
  const size_t side = (size_t)n_ctx * (size_t)c.n_head_kv * (size_t)c.head_dim * 2;
  return (types.k != DType::F16 ? side : 0) + (types.v != DType::F16 ? side : 0);
}

size_t recurrent_bytes_per_layer(const ModelConfig& c, int n_parallel) {
  if (!c.has_recurrent_layers()) return 0;
  const GdnShape s = gdn_shape(c);
  return (size_t)n_parallel * (size_t)(s.conv_state_size() + s.ssm_state_size()) * sizeof(float);
}

size_t scratch_bytes(const ModelConfig& c, int64_t n_batch, int n_parallel) {
  const int64_t n_ff_eff = std::max(c.n_ff, c.n_expert_used * c.n_ff_exp);
  const int64_t conv_dim = c.has_recurrent_layers() ? gdn_shape(c).conv_dim() : 0;
  const int64_t per_token = 4 * c.n_embd + 2 * c.n_head * c.head_dim + 2 * c.n_head_kv * c.head_dim + 3 * n_ff_eff +
                            2 * conv_dim;
  return ((size_t)n_batch * (size_t)per_token + (size_t)n_parallel * (size_t)c.n_vocab) * sizeof(float);
}

MemoryPlan plan_memory(const ModelConfig& c, const ExpertPlan& placement, const MemoryPlanOptions& o) {
  if (o.n_ctx <= 0) fail("context size must be positive, got {}", o.n_ctx);
  if (o.n_parallel <= 0) fail("--parallel must be 1 or more, got {}", o.n_parallel);
  check_kv_type(c, o.cache_types.k, "--cache-type-k");
  check_kv_type(c, o.cache_types.v, "--cache-type-v");
  MemoryPlan p;
  p.cache_types = o.cache_types;
  p.n_ctx = o.n_ctx;
  p.n_ctx_train = c.n_ctx_train;
  p.n_batch = o.n_batch;
  p.n_parallel = o.n_parallel;
  p.host.name = "host";
  p.host.weights = placement.host_bytes;
  // A device that reads its weights in place reads the host's mapped pages.
  if (placement.gpu_weights_in_place)
    p.host.weights += placement.gpu_dense_bytes + placement.gpu_expert_bytes + placement.gpu_output_bytes;
  if (o.file_weight_bytes) p.host.weights = std::min(p.host.weights, o.file_weight_bytes);
  p.host.weights_mapped = o.weights_mapped;
  p.host.available = o.host_available;
  p.host.state_cache = o.cache_ram_bytes;
  const bool offloaded = placement.first_gpu_layer < placement.n_layer;
  if (offloaded) {
    p.gpu = DeviceMemory{};
    p.gpu->name = placement.gpu;
    p.gpu->weights = placement.gpu_dense_bytes + placement.gpu_expert_bytes + placement.gpu_output_bytes;
    p.gpu->available = placement.gpu_free_bytes;
    p.gpu->weights_mapped = placement.gpu_weights_in_place;
  }
  const size_t kv = kv_bytes_per_layer(c, o.n_ctx, o.n_parallel, o.cache_types), rec = recurrent_bytes_per_layer(c, o.n_parallel);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    DeviceMemory& d = offloaded && il >= placement.first_gpu_layer ? *p.gpu : p.host;
    if (c.recurrent(il))
      d.recurrent += rec;
    else d.kv += kv;
  }
  (offloaded ? *p.gpu : p.host).scratch = scratch_bytes(c, o.n_batch, o.n_parallel);
  if (offloaded) p.gpu->scratch += kv_prefill_copy_bytes(c, o.n_ctx, o.cache_types);
  return p;
}

std::string MemoryPlan::summary() const {
  std::string s = fmt::format("memory plan: -c {} (trained {}) x {} slot{}, batch {}, KV {}/{}\n", n_ctx, n_ctx_train,
                              n_parallel, n_parallel == 1 ? "" : "s", n_batch, kv_type_name(cache_types.k),
                              kv_type_name(cache_types.v));
  auto line = [&](const DeviceMemory& d) {
    s += fmt::format("  {}: {} = {}", d.name, parts(d), format_bytes((double)d.total()));
    if (d.available) s += fmt::format(" ({} {})", format_bytes((double)d.available), d.name == "host" ? "available" : "free");
    s += "\n";
  };
  line(host);
  if (gpu) line(*gpu);
  return s;
}

std::string MemoryPlan::check() const {
  // The first thing to try, by what takes the room.
  auto advice = [&](const DeviceMemory& d, bool is_gpu) {
    std::string a;
    if (d.kv || d.recurrent) {
      a = fmt::format("a smaller context (-c; now {})", n_ctx);
      if (n_parallel > 1) a += fmt::format(" or fewer slots (--parallel; now {})", n_parallel);
    }
    if (is_gpu) a += fmt::format("{}fewer GPU layers (-ngl)", a.empty() ? "" : ", or ");
    if (!is_gpu && d.state_cache) a += fmt::format("{}a smaller --cache-ram", a.empty() ? "" : ", or ");
    if (a.empty()) a = "a smaller batch (-b)";
    return a;
  };
  if (gpu && gpu->available && gpu->allocated() > gpu->available)
    fail("{} needs {} ({}) but has {} free; use {}", gpu->name, format_bytes((double)gpu->allocated()), parts(*gpu),
         format_bytes((double)gpu->available), advice(*gpu, true));
  if (host.available && host.allocated() > host.available)
    fail("host RAM: {} must be allocated ({}{}) but {} is available; use {}", format_bytes((double)host.allocated()),
         parts(host), host.weights_mapped ? "; mapped weights not counted" : "", format_bytes((double)host.available),
         advice(host, false));
  if (host.available && host.weights_mapped && host.total() > host.available)
    return fmt::format("host RAM: mapped weights {} + allocations {} exceed the {} available: weights will be read "
                       "from disk again as the kernel drops their pages (slow, but it runs)",
                       format_bytes((double)host.weights), format_bytes((double)host.allocated()),
                       format_bytes((double)host.available));
  return "";
}

size_t host_available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    size_t kib = 0;
    if (in >> kib) return kib * 1024;
  }
  return 0;
}

}  // namespace xpert
