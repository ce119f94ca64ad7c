#include "runtime/kv_cache.h"

#include <atomic>

#include "base/error.h"

namespace xpert {

KvCache::KvCache(const ModelConfig& c, int64_t n_ctx, int n_seq, const std::vector<Backend*>& layer_devices)
    : n_ctx_(n_ctx), n_seq_(n_seq), row_(c.n_head_kv * c.head_dim) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id++;
  if (n_ctx <= 0) fail("context size must be positive, got {}", n_ctx);
  if (n_seq <= 0) fail("the KV cache needs at least one sequence slot, got {}", n_seq);
  const size_t per_layer = (size_t)n_seq * 2 * n_ctx * row_;  // f16 values
  auto attention = [&](int64_t il) { return il >= (int64_t)c.layer_recurrent.size() || !c.layer_recurrent[il]; };
  size_t n_host = 0, n_total = 0;
  for (int64_t il = 0; il < c.n_layer; ++il) {
    if (!attention(il)) continue;
    n_total += per_layer;
    if (il >= (int64_t)layer_devices.size() || !layer_devices[il]) n_host += per_layer;
  }
  const double gib = 2.0 * (double)n_total / (1ull << 30);
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
      device_.emplace_back(*dev, per_layer * sizeof(uint16_t));
      dev->zero(device_.back().data(), per_layer * sizeof(uint16_t));
      layer_[il] = {dev, static_cast<uint16_t*>(device_.back().data())};
    }
  }
  bytes_ = n_total * sizeof(uint16_t);
}

uint16_t* KvCache::at(int64_t layer, int seq, int kv) {
  if (layer < 0 || layer >= (int64_t)layer_.size() || !layer_[layer].base) fail("layer {} has no KV cache", layer);
  return layer_[layer].base + ((size_t)seq * 2 + kv) * (size_t)n_ctx_ * row_;
}

void KvCache::read_rows(int64_t layer, int seq, int kv, int64_t pos0, int64_t n, uint16_t* dst) {
  const uint16_t* src = at(layer, seq, kv) + pos0 * row_;
  const size_t bytes = (size_t)n * row_ * sizeof(uint16_t);
  if (Backend* d = layer_[layer].dev) d->copy_to_host(dst, src, bytes);
  else std::copy_n(src, (size_t)n * row_, dst);
}

void KvCache::write_rows(int64_t layer, int seq, int kv, int64_t pos0, int64_t n, const uint16_t* src) {
  uint16_t* dst = at(layer, seq, kv) + pos0 * row_;
  const size_t bytes = (size_t)n * row_ * sizeof(uint16_t);
  if (Backend* d = layer_[layer].dev) d->copy_from_host(dst, src, bytes);
  else std::copy_n(src, (size_t)n * row_, dst);
}

}  // namespace xpert
