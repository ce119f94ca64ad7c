// Hugging Face `tokenizer.json` (the tokenizer of safetensors checkpoints) -> Vocab, for byte-level BPE.
//
// Supported: model.type "BPE" (vocab, merges as "a b" strings or [a, b] pairs, ignore_merges),
// added_tokens (special -> control, others -> user-defined), pre_tokenizer ByteLevel(use_regex) or
// Sequence[Split(Regex, Isolated), ByteLevel(use_regex = false)] whose regex is one llama.cpp knows
// (mapped to the same tokenizer.ggml.pre configuration), post_processor TemplateProcessing (BOS).
// The NFC normalizer (Qwen) is accepted and not applied, as in llama.cpp: text that is not in NFC may
// tokenize differently from Hugging Face. Anything else throws Error naming the field.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "text/tokenizer.h"

namespace xpert {

// `config`: the checkpoint's tokenizer_config.json (bos_token, eos_token, add_bos_token,
// add_eos_token), or null. `source` names the input in error messages.
Vocab vocab_from_hf_json(const nlohmann::json& tokenizer, const nlohmann::json& config,
                         std::string_view source);

// Reads `path` (a tokenizer.json) and, when it exists, tokenizer_config.json in the same folder.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

}  // namespace xpert
