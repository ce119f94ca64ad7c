#include "runtime/recurrent_state.h"

#include <algorithm>

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

RecurrentState::RecurrentState(const ModelConfig& c, int n_seq) : shape_(gdn_shape(c)), n_seq_(n_seq) {
  if (n_seq <= 0) fail("recurrent state needs at least one sequence slot, got {}", n_seq);
  layer_index_.assign(c.n_layer, -1);
  for (int64_t il = 0; il < c.n_layer && il < (int64_t)c.layer_recurrent.size(); ++il)
    if (c.layer_recurrent[il]) layer_index_[il] = (int32_t)n_recurrent_++;
  slot_floats_ = (size_t)(shape_.conv_state_size() + shape_.ssm_state_size());
  const double bytes = 4.0 * (double)n_recurrent_ * n_seq * slot_floats_;
  if (bytes > 64.0 * (1ull << 30))
    fail("recurrent state of {:.1f} GiB for {} sequences is too large", bytes / (1ull << 30), n_seq);
  data_.assign((size_t)n_recurrent_ * n_seq * slot_floats_, 0.0f);
  n_pos_.assign(n_seq, 0);
}

size_t RecurrentState::offset(int64_t layer, int seq) const {
  const int32_t r = layer_index_[layer];
  if (r < 0) fail("layer {} has no recurrent state", layer);
  return ((size_t)r * n_seq_ + seq) * slot_floats_;
}

void RecurrentState::reset(int seq) {
  for (int64_t r = 0; r < n_recurrent_; ++r)
    std::fill_n(data_.data() + ((size_t)r * n_seq_ + seq) * slot_floats_, slot_floats_, 0.0f);
  n_pos_[seq] = 0;
}

void RecurrentState::reset() {
  std::fill(data_.begin(), data_.end(), 0.0f);
  std::fill(n_pos_.begin(), n_pos_.end(), 0);
}

}  // namespace xpert
