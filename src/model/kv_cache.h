// Attention KV cache: per attention layer and sequence slot, n_ctx rows of n_head_kv * head_dim values for
// K and for V, each in its cache type (--cache-type-k / --cache-type-v): F16, or the GGUF Q8_0 / Q4_0
// blocks of 32 values along each head's dims (so head_dim must be a multiple of 32). Positions index rows
// directly. Each layer's rows live where that layer runs (host memory, or a GPU's memory for an offloaded
// layer); recurrent layers of hybrid models have none.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "quant/dtype.h"

namespace xpert {

struct KvTypes {
  DType k = DType::F16, v = DType::F16;
};

// "f16", "q8_0", "q4_0" (llama.cpp's --cache-type names) -> the type; Error naming the ones known.
DType parse_kv_type(const std::string& name);
std::string kv_type_name(DType t);  // "f16", "q8_0", "q4_0"
// Throws Error when the model's heads cannot be stored in that type (head_dim not a multiple of 32).
void check_kv_type(const ModelConfig& c, DType t, const char* flag = "--cache-type-k");
// Bytes of one position's row (n_head_kv * head_dim values) of one layer's K or V.
size_t kv_row_bytes(const ModelConfig& c, DType t);

class KvCache {
 public:
  // layer_devices[il]: the backend holding layer il's rows, null (or a short vector) for host memory.
  KvCache(const ModelConfig& c, int64_t n_ctx, int n_seq = 1, const std::vector<Backend*>& layer_devices = {},
          KvTypes types = {});
  int64_t n_ctx() const { return n_ctx_; }
  int n_seq() const { return n_seq_; }
  int64_t row() const { return row_; }  // values per position (n_head_kv * head_dim)
  DType type(int kv) const { return kv ? types_.v : types_.k; }
  KvTypes types() const { return types_; }
  size_t row_bytes(int kv) const { return kv ? v_row_bytes_ : k_row_bytes_; }  // bytes per position
  bool has_layer(int64_t layer) const { return layer_[layer].base != nullptr; }
  Backend* device(int64_t layer) const { return layer_[layer].dev; }  // null: host memory
  void* k(int64_t layer, int seq) { return at(layer, seq, 0); }
  void* v(int64_t layer, int seq) { return at(layer, seq, 1); }
  // Rows [pos0, pos0 + n) of K (kv = 0) or V (kv = 1) to / from host memory (n * row_bytes(kv) bytes),
  // wherever the layer lives.
  void read_rows(int64_t layer, int seq, int kv, int64_t pos0, int64_t n, void* dst);
  void write_rows(int64_t layer, int seq, int kv, int64_t pos0, int64_t n, const void* src);
  size_t bytes() const { return bytes_; }
  int64_t slot_stride() const { return (int64_t)slot_bytes_; }  // bytes from one slot's rows to the next
  uint64_t id() const { return id_; }  // unique among the caches of this process (graph keys)

 private:
  struct Layer {
    Backend* dev = nullptr;
    uint8_t* base = nullptr;
  };
  uint8_t* at(int64_t layer, int seq, int kv);
  int64_t n_ctx_;
  int n_seq_;
  int64_t row_;
  KvTypes types_;
  size_t k_row_bytes_, v_row_bytes_, slot_bytes_;  // slot: K rows [n_ctx] then V rows [n_ctx]
  size_t bytes_ = 0;
  uint64_t id_;
  std::vector<Layer> layer_;
  std::vector<uint8_t> host_;         // rows of the host layers
  std::vector<DeviceBuffer> device_;  // one buffer per offloaded layer
};

}  // namespace xpert
