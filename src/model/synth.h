// Synthetic models: a GGUF with a real model's shapes, metadata and tensor names, random weights and a
// small valid vocabulary, so speed can be measured (by xpert and by llama.cpp, on the same file) where
// the real weights cannot be brought. Tensors are generated and written one at a time: a 20 GiB file
// never sits in memory.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "quant/dtype.h"

namespace xpert {

struct SynthPreset {
  std::string name, arch, description;
  int64_t n_layer = 0, n_expert = 0, n_expert_used = 0, n_embd = 0, n_ff = 0, n_ff_exp = 0;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0, n_vocab = 0, n_ctx = 0;
  float rope_base = 1e6f, rms_eps = 1e-6f;
  // Hybrid architectures (qwen35, qwen35moe): every full_attention_interval-th layer is gated full
  // attention with partial rope (n_rot dims, IMRoPE sections), the others Gated DeltaNet with
  // ssm_n_k_heads key heads and ssm_n_v_heads value heads of ssm_head_dim; a sigmoid-gated shared
  // expert of n_ff_shexp beside the routed ones.
  int64_t n_rot = 0, full_attention_interval = 0, n_ff_shexp = 0;
  std::array<int32_t, 4> rope_sections = {0, 0, 0, 0};
  int64_t ssm_d_conv = 0, ssm_n_k_heads = 0, ssm_n_v_heads = 0, ssm_head_dim = 0;
};

const std::vector<SynthPreset>& synth_presets();
// The preset of that name; throws Error listing the known ones.
const SynthPreset& synth_preset(const std::string& name);
// The weight-type mixes `--type` accepts: Q4_K_M, Q8_0, F16, BF16, F32.
std::vector<std::string> synth_types();

// What a file of this preset and type holds, without writing it: tensors in file order (shape in ggml
// order) and metadata.
struct SynthTensor {
  std::string name;
  DType type;
  std::vector<int64_t> shape;
};
struct SynthPlan {
  std::vector<SynthTensor> tensors;
  std::vector<std::pair<std::string, gguf::Value>> metadata;
  int64_t n_params = 0;
  size_t tensor_bytes = 0;
};
SynthPlan synth_plan(const std::string& preset, const std::string& type);

struct SynthOptions {
  std::string preset = "tiny-qwen3moe";
  std::string type = "Q4_K_M";
  std::string output;
  uint64_t seed = 0;
  std::function<void(size_t done_bytes, size_t total_bytes)> progress = {};  // optional
};

struct SynthResult {
  size_t file_bytes = 0;
  int64_t n_params = 0;
};

// Writes the file; throws Error on bad options or I/O failure (and removes the partial file).
SynthResult synth_write(const SynthOptions& o);

}  // namespace xpert
