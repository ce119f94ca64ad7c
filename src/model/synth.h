// Synthetic models: a GGUF with a real model's shapes, metadata and tensor names, random weights and a
// small valid vocabulary, so speed can be measured (by xpert and by llama.cpp, on the same file) where
// the real weights cannot be brought. Tensors are generated and written one at a time: a 16 GiB file
// never sits in memory.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace xpert {

struct SynthPreset {
  std::string name, arch, description;
  int64_t n_layer = 0, n_expert = 0, n_expert_used = 0, n_embd = 0, n_ff = 0, n_ff_exp = 0;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0, n_vocab = 0, n_ctx = 0;
  float rope_base = 1e6f, rms_eps = 1e-6f;
};

const std::vector<SynthPreset>& synth_presets();
// The preset of that name; throws Error listing the known ones (or saying it is not available yet).
const SynthPreset& synth_preset(const std::string& name);
// The weight-type mixes `--type` accepts: Q4_K_M, Q8_0, F16, BF16, F32.
std::vector<std::string> synth_types();

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
