// Private to src/text/: the factories of the tokenizer models Tokenizer::create dispatches to.
#pragma once
#include <memory>

#include "text/tokenizer.h"

namespace xpert {

// tokenizer.ggml.model = "llama": SentencePiece-style (score-ordered bigram merges, byte fallback).
std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab&& vocab);
// tokenizer.ggml.model = "gpt2": byte-level BPE (ranked merges, pre-tokenizer regexes by `pre`).
std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab&& vocab);

}  // namespace xpert
