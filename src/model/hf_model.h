// A Hugging Face checkpoint folder (config.json + safetensors, optionally GPTQ INT4) as an in-memory
// GGUF, so every architecture class loads it unchanged. config.json becomes the metadata keys llama.cpp's
// converter writes (general.architecture qwen3 / qwen3moe / qwen35 / qwen35moe), HF tensors become GGUF
// tensors under llama.cpp's names and layouts, with the converter's transformations:
//   - every architecture: per-expert matrices gathered into one [n_expert, ...] tensor; vectors as F32;
//     GPTQ INT4 layers repacked losslessly into Q4_0 (quant/gptq.h), or experts kept as stored
//     (OpenOptions::native_gptq_experts); asymmetric GPTQ outside native experts becomes F32
//   - Qwen3.5: RMSNorm weights w -> 1 + w (the gated norm of the linear-attention layers excepted),
//     A_log -> -exp(A_log), conv1d [C, 1, K] -> [C, K], value heads from grouped to tiled order when
//     there are fewer key heads than value heads (rows of in_proj_qkv's v part, in_proj_z, in_proj_a/b,
//     conv1d, dt_bias, A_log; columns of out_proj)
// Float matrices that need no change stay in their type and point into the mapped safetensors;
// everything transformed or repacked goes into one owned buffer per model. The tokenizer comes along as
// GGUF tokenizer.* metadata (model/hf_vocab.h).
#pragma once
#include <memory>
#include <string>

#include "format/gguf.h"

namespace xpert::hf {

struct OpenOptions {
  // GPTQ experts in their native types (DType GPTQ4_*: quant/gptq.h) rather than repacked to Q4_0. The CPU's,
  // the OpenCL expert device's and CUDA's MoE kernels read them (not the whole-model OpenCL backend), so only
  // for a placement whose experts all run on those (runtime/placement.h: native_gptq_experts).
  bool native_gptq_experts = false;
};

// Throws Error naming the file, field or tensor for anything missing, malformed or unsupported.
std::unique_ptr<gguf::GGUFFile> open_folder(const std::string& dir, const OpenOptions& options = {});

// Writes an (assembled) GGUFFile to a GGUF v3 file: the HF -> GGUF conversion, for llama.cpp.
void save_gguf(const gguf::GGUFFile& f, const std::string& path);

}  // namespace xpert::hf
