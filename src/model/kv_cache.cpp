#include "model/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>

#include "base/error.h"

namespace xpert {

DType parse_kv_type(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char ch) { return (char)std::tolower(ch); });
  if (n == "f16") return DType::F16;
  if (n == "q8_0") return DType::Q8_0;
  if (n == "q4_0") return DType::Q4_0;
  fail("unknown KV cache type '{}' (known: f16, q8_0, q4_0)", name);
}

std::string kv_type_name(DType t) {
  switch (t) {
    case DType::F16: return "f16";
    case DType::Q8_0: return "q8_0";
    case DType::Q4_0: return "q4_0";
    default: return std::string(dtype_name(t));
  }
}

void check_kv_type(const ModelConfig& c, DType t, const char* flag) {
  if (t != DType::F16 && t != DType::Q8_0 && t != DType::Q4_0)
    fail("{} {}: the KV cache holds f16, q8_0 or q4_0", flag, kv_type_name(t));
  const int64_t block = dtype_info(t).block_size;
  if (c.head_dim % block != 0)
    fail("{} {} stores blocks of {} values along each head, but this model's head_dim is {}; use f16", flag,
         kv_type_name(t), block, c.head_dim);
}

size_t kv_row_bytes(const ModelConfig& c, DType t) { return row_bytes(t, c.n_head_kv * c.head_dim); }

KvCache::KvCache(const ModelConfig& c, int64_t n_ctx, int n_seq, const std::vector<Backend*>& layer_devices,
                 KvTypes types)
    : n_ctx_(n_ctx), n_seq_(n_seq), row_(c.n_head_kv * c.head_dim), types_(types) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id++;
  if (n_ctx <= 0) fail("context size must be positive, got {}", n_ctx);
  if (n_seq <= 0) fail("the KV cache needs at least one sequence slot, got {}", n_seq);
  check_kv_type(c, types.k, "--cache-type-k");
  check_kv_type(c, types.v, "--cache-type-v");
  k_row_bytes_ = kv_row_bytes(c, types.k);
  v_row_bytes_ = kv_row_bytes(c, types.v);
  slot_bytes_ = (size_t)n_ctx * (k_row_bytes_ + v_row_bytes_);
  const size_t per_layer = (size_t)n_seq * slot_bytes_;
  auto attention = [&](int64_t il) { return !c.recurrent(il); };
  size_t n_host = 0, n_total = 0;
  for (int64_t il = 0; il < c.n_layer; ++il) {
    if (!attention(il)) continue;
    n_total += per_layer;
    if (il >= (int64_t)layer_devices.size() || !layer_devices[il]) n_host += per_layer;
  }
  const double gib = (double)n_total / (1ull << 30);
  if (gib > 64.0) fail("KV cache of {:.1f} GiB for -c {} is too large; use a smaller context", gib, n_ctx);
  host_.assign(n_host, 0);
  layer_.resize(c.n_layer);
  size_t host_off = 0;
  for (int64_t il = 0; il < c.n_layer; ++il) {
    if (!attention(il)) continue;
    Backend* dev = il < (int64_t)layer_devices.size() ? layer_devices[il] : nullptr;
    if (!dev) {
      layer_[il] = {nullptr, host_.data() + host_off};
      host_off += per_layer;
    } else {
      device_.emplace_back(*dev, per_layer);
      dev->zero(device_.back().data(), per_layer);
      layer_[il] = {dev, static_cast<uint8_t*>(device_.back().data())};
    }
  }
  bytes_ = n_total;
}

uint8_t* KvCache::at(int64_t layer, int seq, int kv) {
  if (layer < 0 || layer >= (int64_t)layer_.size() || !layer_[layer].base) fail("layer {} has no KV cache", layer);
  return layer_[layer].base + (size_t)seq * slot_bytes_ + (kv ? (size_t)n_ctx_ * k_row_bytes_ : 0);
}

void KvCache::read_rows(int64_t layer, int seq, int kv, int64_t pos0, int64_t n, void* dst) {
  const uint8_t* src = at(layer, seq, kv) + (size_t)pos0 * row_bytes(kv);
  const size_t bytes = (size_t)n * row_bytes(kv);
  if (Backend* d = layer_[layer].dev) d->copy_to_host(dst, src, bytes);
  else std::memcpy(dst, src, bytes);
}

void KvCache::write_rows(int64_t layer, int seq, int kv, int64_t pos0, int64_t n, const void* src) {
  uint8_t* dst = at(layer, seq, kv) + (size_t)pos0 * row_bytes(kv);
  const size_t bytes = (size_t)n * row_bytes(kv);
  if (Backend* d = layer_[layer].dev) d->copy_from_host(dst, src, bytes);
  else std::memcpy(dst, src, bytes);
}

}  // namespace xpert
