// Per-sequence state of a hybrid model's recurrent (Gated DeltaNet) layers: for each sequence slot and
// recurrent layer, the conv state [d_conv-1][conv_dim] and the delta-rule state
// [n_v_heads][head_k_dim][head_v_dim], fp32. Unlike the KV cache it cannot be rolled back, so each slot
// also records the position it has reached: a batch must continue a slot exactly there, or restart it
// at position 0 (which clears it). Each layer's state lives where that layer runs (host memory, or a
// GPU's memory for an offloaded layer).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/gated_delta_net.h"
#include "model/model.h"

namespace xpert {

// The GDN shape of a model's recurrent layers, from its config.
GdnShape gdn_shape(const ModelConfig& c);

class RecurrentState {
 public:
  // layer_devices[il]: the backend holding layer il's state, null (or a short vector) for host memory.
  RecurrentState(const ModelConfig& c, int n_seq = 1, const std::vector<Backend*>& layer_devices = {});
  int n_seq() const { return n_seq_; }
  const GdnShape& shape() const { return shape_; }
  float* conv(int64_t layer, int seq) { return base_[layer] + offset(layer, seq); }
  float* ssm(int64_t layer, int seq) { return conv(layer, seq) + shape_.conv_state_size(); }
  int64_t n_pos(int seq) const { return n_pos_[seq]; }  // tokens the slot's state has absorbed
  void set_n_pos(int seq, int64_t n) { n_pos_[seq] = n; }
  // One layer's state of one slot (conv then ssm, slot_floats() values) to / from host memory.
  size_t slot_floats() const { return slot_floats_; }
  void read(int64_t layer, int seq, float* dst);
  void write(int64_t layer, int seq, const float* src);
  void reset(int seq);  // zero state, position 0
  void reset();
  size_t bytes() const { return bytes_; }
  uint64_t id() const { return id_; }  // unique among the states of this process (graph keys)

 private:
  size_t offset(int64_t layer, int seq) const;
  GdnShape shape_;
  int n_seq_;
  std::vector<int32_t> layer_index_;  // model layer -> index among recurrent layers, -1 for attention
  int64_t n_recurrent_ = 0;
  size_t slot_floats_ = 0;  // per layer and slot
  size_t bytes_ = 0;
  uint64_t id_ = 0;
  std::vector<float*> base_;           // per model layer: its slots' states (null: not recurrent)
  std::vector<Backend*> dev_;          // per model layer: null for host memory
  std::vector<float> host_;            // host layers' states
  std::vector<DeviceBuffer> device_;   // one buffer per offloaded recurrent layer
  std::vector<int64_t> n_pos_;
};

}  // namespace xpert
