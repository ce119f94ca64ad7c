// The tokenizer of a Hugging Face checkpoint folder (tokenizer.json, tokenizer_config.json,
// chat_template.jinja) as the GGUF `tokenizer.*` metadata llama.cpp's converter writes, so that
// Tokenizer::from_gguf and the chat-template code read a folder exactly as they read a GGUF file.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/gguf.h"

namespace xpert::hf {

using Metadata = std::vector<std::pair<std::string, gguf::Value>>;

// Appends tokenizer.ggml.* (and tokenizer.chat_template when the folder has one). The token list is
// padded to `n_vocab` (the embedding's rows) with unused "[PADi]" tokens, as llama.cpp's converter
// does; n_vocab <= 0 leaves it as is. Returns false, adding nothing, when there is no tokenizer.json.
bool add_tokenizer_metadata(const std::string& dir, int64_t n_vocab, Metadata& kv);

// chat_template.jinja, else tokenizer_config.json's chat_template (a string, or a list of
// {name, template} of which "default" is taken).
std::optional<std::string> chat_template(const std::string& dir);

// The tokenizer metadata of a folder without its weights (what `xpert tokenize` needs). Throws Error
// when the folder has no tokenizer.json.
std::unique_ptr<gguf::GGUFFile> open_tokenizer_only(const std::string& dir);

}  // namespace xpert::hf
