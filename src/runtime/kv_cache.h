// Attention KV cache: per attention layer and sequence slot, n_ctx rows of n_head_kv * head_dim f16
// values for K and for V. Positions index rows directly. Each layer's rows live where that layer runs
// (host memory, or a GPU's memory for an offloaded layer); recurrent layers of hybrid models have none.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"

namespace xpert {

class KvCache {
 public:
  // layer_devices[il]: the backend holding layer il's rows, null (or a short vector) for host memory.
  KvCache(const ModelConfig& c, int64_t n_ctx, int n_seq = 1, const std::vector<Backend*>& layer_devices = {});
  int64_t n_ctx() const { return n_ctx_; }
  int n_seq() const { return n_seq_; }
  int64_t row() const { return row_; }  // f16 values per position
  bool has_layer(int64_t layer) const { return layer_[layer].base != nullptr; }
  Backend* device(int64_t layer) const { return layer_[layer].dev; }  // null: host memory
  uint16_t* k(int64_t layer, int seq) { return at(layer, seq, 0); }
  uint16_t* v(int64_t layer, int seq) { return at(layer, seq, 1); }
  // Rows [pos0, pos0 + n) of K (kv = 0) or V (kv = 1) to / from host memory, wherever the layer lives.
  void read_rows(int64_t layer, int seq, int kv, int64_t pos0, int64_t n, uint16_t* dst);
  void write_rows(int64_t layer, int seq, int kv, int64_t pos0, int64_t n, const uint16_t* src);
  size_t bytes() const { return bytes_; }
  int64_t slot_stride() const { return 2 * n_ctx_ * row_; }  // f16 values from one slot's rows to the next
  uint64_t id() const { return id_; }  // unique among the caches of this process (graph keys)

 private:
  struct Layer {
    Backend* dev = nullptr;
    uint16_t* base = nullptr;
  };
  uint16_t* at(int64_t layer, int seq, int kv);
  int64_t n_ctx_;
  int n_seq_;
  int64_t row_;
  size_t bytes_ = 0;
  uint64_t id_;
  std::vector<Layer> layer_;
  std::vector<uint16_t> host_;        // rows of the host layers
  std::vector<DeviceBuffer> device_;  // one buffer per offloaded layer
};

}  // namespace xpert
