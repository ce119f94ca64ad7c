// Helpers the architecture files use to read their hyper-parameters and tensor tables from a GGUF.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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

// ---- The tensor tables ----
// Each architecture file lists its tensors once, as data (TensorDecl); loading (load_tensors),
// `xpert synth` (model/synth.cpp) and the Hugging Face converter (model/hf_model.cpp) all read that list.

// How `xpert synth` fills a tensor.
enum class SynthFill : uint8_t {
  matrix,     // rows of the type mix's main type, drawn from random pools
  more_bits,  // the same; Q4_K_M gives these more bits in some layers (llama.cpp: attn_v-like, ffn_down)
  output,     // the output head: the mix's output type
  ones,       // F32 norm weights
  normal,     // F32 small tensors: router, conv kernel, biases, gates
  decay,      // F32 ssm_a = -exp(A_log), negative so the recurrent state decays
};

// Where the Hugging Face converter finds a tensor. Layer tensors are named relative to
// "model.layers.<il>."; io tensors by full name, where "model." stands for the text model's prefix
// (model.language_model. in multimodal checkpoints).
enum class HfForm : uint8_t {
  none,     // not converted
  linear,   // the module `name`: name.weight [rows][cols] (or GPTQ name.qweight + scales) -> {cols, rows}
  vector,   // the tensor `name` [n] (or [1, n]) -> F32 {n}
  conv1d,   // the tensor `name` [C, 1, K] -> F32 {K, C}
  experts,  // mlp.experts.<e>.`name` per expert (gate_proj / up_proj / down_proj), or sliced from the
            // fused mlp.experts.gate_up_proj [X, 2F, E] / down_proj [X, E, F] -> {cols, rows, X}
};
enum class HfFn : uint8_t { none, plus_one, minus_exp };  // applied to each element of a vector
// Qwen3.5's value heads, grouped by key head in HF and tiled in GGUF: which axis of the tensor they index.
enum class HfHeads : uint8_t {
  none,
  rows,      // one row (element) per value head
  v_rows,    // rows in runs of head_v_dim
  qkv_rows,  // q | k | v rows: the v part in runs of head_v_dim
  v_cols,    // columns in runs of head_v_dim
};
struct HfSource {
  HfForm form = HfForm::none;
  const char* name = "";
  HfFn fn = HfFn::none;
  HfHeads heads = HfHeads::none;
};
inline HfSource hf_linear(const char* name, HfHeads heads = HfHeads::none) {
  return {HfForm::linear, name, HfFn::none, heads};
}
inline HfSource hf_vector(const char* name, HfFn fn = HfFn::none, HfHeads heads = HfHeads::none) {
  return {HfForm::vector, name, fn, heads};
}
inline HfSource hf_conv1d(const char* name, HfHeads heads) {
  return {HfForm::conv1d, name, HfFn::none, heads};
}
inline HfSource hf_experts(const char* proj) { return {HfForm::experts, proj}; }

enum class Need : uint8_t { required, optional };

// One tensor: GGUF name (a layer's without the "blk.<il>." prefix), shape (ggml order), the field it
// loads into, how synth fills it, where the converter finds it; an optional tensor may be absent.
struct TensorDecl {
  std::string name;
  std::vector<int64_t> shape;
  Weight LayerWeights::*field = nullptr;
  SynthFill synth = SynthFill::matrix;
  HfSource hf = {};
  Need need = Need::required;
  Weight ModelWeights::*io_field = nullptr;  // the io tensors' field instead of `field`
};
using TensorList = std::vector<TensorDecl>;
inline void append(TensorList& t, TensorList more) { t.insert(t.end(), more.begin(), more.end()); }

// An architecture's table: layer il's tensors in llama.cpp's file order; il = kIoTensors: the
// embedding, the final norm and the output head (optional: tied to the embedding).
constexpr int64_t kIoTensors = -1;
using TensorTableFn = TensorList (*)(const ModelConfig& c, int64_t il);
// The io tensors every architecture shares; norm_fn: what the converter does to the final norm.
TensorList io_tensors(const ModelConfig& c, HfFn norm_fn = HfFn::none);
// A layer's attention projections q/k/v/o, optionally q/k/v biases and per-head q/k norms. gated: q
// holds q and its output gate per head ([q_h, gate_h] for each head h: Qwen3.5, as HF's q_proj has
// them). norm_fn: what the converter does to the q/k norms.
struct AttentionTensors {
  bool bias = false, qk_norm = false, gated = false;
  HfFn norm_fn = HfFn::none;
};
TensorList attention_tensors(const ModelConfig& c, AttentionTensors what);
// The tables, one per architecture file.
TensorList gemma3_tensors(const ModelConfig& c, int64_t il);
TensorList llama_dense_tensors(const ModelConfig& c, int64_t il);  // llama, qwen2, qwen3
TensorList qwen3moe_tensors(const ModelConfig& c, int64_t il);
TensorList qwen35_tensors(const ModelConfig& c, int64_t il);  // qwen35, qwen35moe
// The table of an architecture; throws Error for one without.
TensorTableFn tensor_table(const std::string& arch);
inline std::string layer_tensor_name(int64_t il, const std::string& suffix) {
  return il == kIoTensors ? suffix : "blk." + std::to_string(il) + "." + suffix;
}

// Loads every tensor of the table into w, checking shape (expected vs actual, with the tensor's name)
// and that xpert can compute its type.
void load_tensors(const gguf::GGUFFile& f, const ModelConfig& c, TensorTableFn table, ModelWeights& w);

// Fills the fields every llama-like architecture shares (sizes, heads, rope, eps, vocab).
// Without require_ff, a missing feed_forward_length leaves n_ff = 0 (MoE-only files).
void read_common_config(const gguf::GGUFFile& f, ModelConfig& c, bool require_ff = true);

// The architecture factories (one file each).
std::unique_ptr<Model> make_gemma3(std::unique_ptr<gguf::GGUFFile> f);
std::unique_ptr<Model> make_llama_dense(std::unique_ptr<gguf::GGUFFile> f);
std::unique_ptr<Model> make_qwen3moe(std::unique_ptr<gguf::GGUFFile> f);
std::unique_ptr<Model> make_qwen35(std::unique_ptr<gguf::GGUFFile> f);  // qwen35 and qwen35moe

}  // namespace xpert
