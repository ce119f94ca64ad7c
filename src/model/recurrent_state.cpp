#include "model/recurrent_state.h"

#include <algorithm>
#include <atomic>

#include "base/error.h"

namespace xpert {

GdnShape gdn_shape(const ModelConfig& c) {
  GdnShape s;
  s.d_conv = c.ssm_d_conv;
  s.n_k_heads = c.ssm_n_group;
  s.n_v_heads = c.ssm_dt_rank;
  s.head_k_dim = c.ssm_d_state;
  s.head_v_dim = c.ssm_dt_rank > 0 ? c.ssm_d_inner / c.ssm_dt_rank : 0;
  s.eps = c.rms_eps;
  return s;
}

RecurrentState::RecurrentState(const ModelConfig& c, int n_seq, const std::vector<Backend*>& layer_devices)
    : shape_(gdn_shape(c)), n_seq_(n_seq) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id++;
  if (n_seq <= 0) fail("recurrent state needs at least one sequence slot, got {}", n_seq);
  layer_index_.assign(c.n_layer, -1);
  for (int64_t il = 0; il < c.n_layer && il < (int64_t)c.layer_recurrent.size(); ++il)
    if (c.layer_recurrent[il]) layer_index_[il] = (int32_t)n_recurrent_++;
  slot_floats_ = (size_t)(shape_.conv_state_size() + shape_.ssm_state_size());
  const size_t per_layer = (size_t)n_seq * slot_floats_;
  bytes_ = (size_t)n_recurrent_ * per_layer * sizeof(float);
  if ((double)bytes_ > 64.0 * (1ull << 30))
    fail("recurrent state of {:.1f} GiB for {} sequences is too large", (double)bytes_ / (1ull << 30), n_seq);
  auto device = [&](int64_t il) { return il < (int64_t)layer_devices.size() ? layer_devices[il] : nullptr; };
  size_t n_host = 0;
  for (int64_t il = 0; il < c.n_layer; ++il)
    if (layer_index_[il] >= 0 && !device(il)) n_host += per_layer;
  host_.assign(n_host, 0.0f);
  base_.assign(c.n_layer, nullptr);
  dev_.assign(c.n_layer, nullptr);
  size_t host_off = 0;
  for (int64_t il = 0; il < c.n_layer; ++il) {
    if (layer_index_[il] < 0) continue;
    if (Backend* d = device(il)) {
      device_.emplace_back(*d, per_layer * sizeof(float));
      d->zero(device_.back().data(), per_layer * sizeof(float));
      base_[il] = static_cast<float*>(device_.back().data());
      dev_[il] = d;
    } else {
      base_[il] = host_.data() + host_off;
      host_off += per_layer;
    }
  }
  n_pos_.assign(n_seq, 0);
}

size_t RecurrentState::offset(int64_t layer, int seq) const {
  if (layer < 0 || layer >= (int64_t)layer_index_.size() || layer_index_[layer] < 0)
    fail("layer {} has no recurrent state", layer);
  return (size_t)seq * slot_floats_;
}

void RecurrentState::read(int64_t layer, int seq, float* dst) {
  const float* src = conv(layer, seq);
  if (Backend* d = dev_[layer]) d->copy_to_host(dst, src, slot_floats_ * sizeof(float));
  else std::copy_n(src, slot_floats_, dst);
}

void RecurrentState::write(int64_t layer, int seq, const float* src) {
  float* dst = conv(layer, seq);
  if (Backend* d = dev_[layer]) d->copy_from_host(dst, src, slot_floats_ * sizeof(float));
  else std::copy_n(src, slot_floats_, dst);
}

void RecurrentState::reset(int seq) {
  for (size_t il = 0; il < base_.size(); ++il) {
    if (!base_[il]) continue;
    float* p = base_[il] + (size_t)seq * slot_floats_;
    if (dev_[il]) dev_[il]->zero(p, slot_floats_ * sizeof(float));
    else std::fill_n(p, slot_floats_, 0.0f);
  }
  n_pos_[seq] = 0;
}

void RecurrentState::reset() {
  for (int s = 0; s < n_seq_; ++s) reset(s);
}

}  // namespace xpert
