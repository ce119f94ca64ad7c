// Attention KV cache: per layer and sequence slot, n_ctx rows of n_head_kv * head_dim f16 values for K
// and for V. Positions index rows directly.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace xpert {

class KvCache {
 public:
  KvCache(const ModelConfig& c, int64_t n_ctx, int n_seq = 1);
  int64_t n_ctx() const { return n_ctx_; }
  int n_seq() const { return n_seq_; }
  int64_t row() const { return row_; }  // f16 values per position
  uint16_t* k(int64_t layer, int seq) { return data_.data() + offset(layer, seq, 0); }
  uint16_t* v(int64_t layer, int seq) { return data_.data() + offset(layer, seq, 1); }
  size_t bytes() const { return data_.size() * sizeof(uint16_t); }

 private:
  size_t offset(int64_t layer, int seq, int kv) const {
    return (((size_t)layer * n_seq_ + seq) * 2 + kv) * (size_t)n_ctx_ * row_;
  }
  int64_t n_ctx_;
  int n_seq_;
  int64_t row_;
  std::vector<uint16_t> data_;
};

}  // namespace xpert
