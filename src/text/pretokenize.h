// Pre-tokenization for byte-level BPE: text -> words, by the regexes llama.cpp selects with
// `tokenizer.ggml.pre` (src/llama-vocab.cpp), run with PCRE2 (UTF + UCP, JIT when available).
//
// Several regexes apply one after the other, as in llama.cpp: each splits every word the previous one
// produced, keeping both the matches and the unmatched stretches between them as words (Hugging Face's
// Split pre-tokenizer with behavior "Isolated"). Lookarounds see only the word being split.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xpert {

// What a `tokenizer.ggml.pre` name stands for.
struct PreTokenizerSpec {
  std::string_view name;                  // canonical name, as the converters write it
  std::vector<std::string_view> regexes;  // applied in order
  std::string_view hf_regex;              // the Split pattern of the Hugging Face tokenizer.json, if any
  bool ignore_merges = false;             // a word that is a whole token is taken as is (Llama 3)
  bool add_bos = false;                   // llama.cpp's default when the file does not say
};

// The spec for a tokenizer.ggml.pre value (aliases included); nullptr when unknown.
const PreTokenizerSpec* find_pre_tokenizer(std::string_view name);
// The spec whose Hugging Face Split pattern (or llama.cpp regex) is `pattern`; nullptr when none.
const PreTokenizerSpec* find_pre_tokenizer_by_regex(std::string_view pattern);
// Names accepted by find_pre_tokenizer, for error messages.
std::string known_pre_tokenizers();

class PreTokenizer {
 public:
  // Throws Error when a regex does not compile.
  explicit PreTokenizer(std::span<const std::string_view> regexes);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the words of `text` (which must be valid UTF-8) to `words`, in order; they cover it.
  // Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& words) const;

 private:
  struct Regex;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

// llama.cpp reads text as code points and turns every byte that does not start a well-formed UTF-8
// sequence into U+FFFD. Returns false (and leaves `out` alone) when `text` needs no change.
bool replace_invalid_utf8(std::string_view text, std::string& out);

}  // namespace xpert
