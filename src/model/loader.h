// Helpers the architecture files use to read their hyper-parameters and tensor tables from a GGUF.
#pragma once
#include <initializer_list>
#include <string>

#include "format/gguf.h"
#include "model/model.h"

namespace xpert {

// Reads "<arch>.<key>" metadata with clear errors.
class ArchKeys {
 public:
  ArchKeys(const gguf::GGUFFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  int64_t require_int(const std::string& key) const { return f_.require_int(arch_ + "." + key); }
  int64_t get_int(const std::string& key, int64_t def) const {
    return f_.get_int(arch_ + "." + key).value_or(def);
  }
  double require_float(const std::string& key) const { return f_.require_float(arch_ + "." + key); }
  double get_float(const std::string& key, double def) const {
    return f_.get_float(arch_ + "." + key).value_or(def);
  }
  const gguf::Value* find(const std::string& key) const { return f_.find(arch_ + "." + key); }

 private:
  const gguf::GGUFFile& f_;
  std::string arch_;
};

// Looks tensors up by name and checks their shape (ggml order) and that xpert can compute their type.
class TensorTable {
 public:
  explicit TensorTable(const gguf::GGUFFile& f) : f_(f) {}
  Weight require(const std::string& name, std::initializer_list<int64_t> shape) const;
  Weight optional(const std::string& name, std::initializer_list<int64_t> shape) const;
  static std::string layer(int64_t il, const char* suffix);  // "blk.<il>.<suffix>"

 private:
  Weight check(const gguf::TensorInfo& t, std::initializer_list<int64_t> shape) const;
  const gguf::GGUFFile& f_;
};

// The tensors every decoder shares: embedding, final norm, output (optional: tied to the embedding).
void require_io_weights(const TensorTable& t, const ModelConfig& c, ModelWeights& w);
// A layer's attention block: norm, q/k/v/o projections, and optionally q/k/v biases and per-head q/k norms.
struct AttentionTensors {
  bool bias = false, qk_norm = false;
};
void require_attention(const TensorTable& t, const ModelConfig& c, int64_t il, AttentionTensors what, LayerWeights& l);

// Fills the fields every llama-like architecture shares (sizes, heads, rope, eps, vocab).
// Without require_ff, a missing feed_forward_length leaves n_ff = 0 (MoE-only files).
void read_common_config(const gguf::GGUFFile& f, ModelConfig& c, bool require_ff = true);

// The architecture factories (one file each).
std::unique_ptr<Model> make_gemma3(std::unique_ptr<gguf::GGUFFile> f);
std::unique_ptr<Model> make_llama_dense(std::unique_ptr<gguf::GGUFFile> f);
std::unique_ptr<Model> make_qwen3moe(std::unique_ptr<gguf::GGUFFile> f);
std::unique_ptr<Model> make_qwen35(std::unique_ptr<gguf::GGUFFile> f);  // qwen35 and qwen35moe

}  // namespace xpert
