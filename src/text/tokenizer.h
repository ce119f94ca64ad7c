// Text <-> token ids, token for token equal to llama.cpp for the same vocabulary.
//
// A Tokenizer is built once from a model's vocabulary (GGUF `tokenizer.ggml.*`) and is immutable and
// thread-safe afterwards. The parts every vocabulary type shares live in the base class: special-token
// partitioning of the input, BOS/EOS, pieces of control / user-defined / byte tokens, the
// end-of-generation set. Each tokenizer model ("llama" = SentencePiece-style, later "gpt2" = byte-level
// BPE) implements only how a run of plain text becomes ids and how a normal token is spelled.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xpert::gguf {
class GGUFFile;
}

namespace xpert {

// Token attributes, as bit flags (values as in llama.h's llama_token_attr, so dumps compare directly).
// A token may carry more than one: llama.cpp promotes end-of-generation tokens such as "</s>" to
// control while they stay user-defined.
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
};

// GGUF `tokenizer.ggml.token_type` values.
enum class TokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6
};
uint32_t attr_of_type(TokenType t);

inline constexpr int32_t kNoToken = -1;

// Everything a tokenizer is built from; from_gguf fills it from the file, tests build small ones.
struct Vocab {
  std::string model = "llama";     // tokenizer.ggml.model
  std::string pre = "default";     // tokenizer.ggml.pre
  std::vector<std::string> texts;  // [n_vocab] piece text as stored (SPM: spaces are U+2581)
  std::vector<float> scores;       // [n_vocab] SPM merge priority (higher merges first); may be empty
  std::vector<TokenType> types;    // [n_vocab]; empty means all normal
  std::vector<std::string> merges; // gpt2: BPE merges "left right", best (rank 0) first
  int32_t bos = kNoToken, eos = kNoToken, unk = kNoToken, pad = kNoToken;
  int32_t eot = kNoToken, eom = kNoToken;  // explicit ids; found by text when absent
  bool add_bos = true, add_eos = false, add_space_prefix = true;
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* from the file. Throws Error for a missing or malformed vocabulary and for
  // tokenizer models this build does not implement.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::GGUFFile& file);
  static std::unique_ptr<Tokenizer> create(Vocab vocab);
  virtual ~Tokenizer();

  // add_special: prepend BOS when the model asks for it (add_bos()), append EOS when add_eos().
  // parse_special: split control tokens written literally in `text` ("<start_of_turn>") out as their
  // ids; when false they are tokenized as plain text. User-defined tokens ("\n", runs of spaces, tags)
  // are always matched as whole pieces, as llama.cpp and HF tokenizers do.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // As above with parse_special, except that no control token is read inside the `literal` byte ranges
  // [begin, end) (sorted, disjoint): a chat prompt's user text stays text even where it spells
  // "<end_of_turn>", while the template's own markers around it become control tokens.
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              std::span<const std::pair<size_t, size_t>> literal) const;
  // The byte ranges of `text` that parse_special would read as control or unknown tokens.
  std::vector<std::pair<size_t, size_t>> control_spans(std::string_view text) const;

  // The bytes a token stands for. Control and unknown tokens give their text only when `special`;
  // byte tokens give one raw byte, so a piece may be an incomplete UTF-8 sequence.
  std::string token_to_piece(int32_t id, bool special) const;
  void append_piece(int32_t id, bool special, std::string& out) const;
  // Concatenated pieces (llama_detokenize with remove_special = false, unparse_special = special).
  std::string decode(std::span<const int32_t> ids, bool special) const;

  int32_t n_vocab() const { return static_cast<int32_t>(offsets_.size()) - 1; }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t unk() const { return unk_; }
  int32_t pad() const { return pad_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }  // sorted
  bool is_control(int32_t id) const { return valid(id) && (attrs_[id] & kAttrControl); }
  const std::string& model_name() const { return model_; }

  std::string_view token_text(int32_t id) const;  // as stored in the vocabulary
  float token_score(int32_t id) const { return scores_.at(id); }
  uint32_t token_attr(int32_t id) const { return attrs_.at(id); }
  std::optional<int32_t> find_token(std::string_view text) const;

 protected:
  explicit Tokenizer(Vocab&& vocab);

  // One run of plain text between special tokens. `after_special` is true for the first run and for
  // runs that follow a special token (SentencePiece's space prefix goes there).
  virtual void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const = 0;
  // The bytes of a NORMAL token.
  virtual void append_normal_piece(int32_t id, std::string& out) const = 0;

  bool valid(int32_t id) const { return id >= 0 && id < n_vocab(); }
  // Piece -> id lookup, built once; kNoToken when absent.
  int32_t lookup(std::string_view text) const;
  // The id emitted for a raw byte no piece covers: <0xXX>, else the one-byte piece, else unk.
  int32_t byte_token(uint8_t b) const { return byte_tokens_[b]; }

  bool add_space_prefix_ = true;

 private:
  struct Segment;
  void build_index();
  void build_special_matcher();
  void find_eog_tokens(int32_t eot_hint, int32_t eom_hint);
  void partition(std::string_view text, bool parse_special, std::vector<Segment>& out,
                 std::span<const std::pair<size_t, size_t>> literal = {}) const;
  std::vector<int32_t> encode_parts(std::string_view text, bool add_special, bool parse_special,
                                    std::span<const std::pair<size_t, size_t>> literal) const;

  std::string model_;
  // All token texts back to back; token i is arena_[offsets_[i], offsets_[i + 1]).
  std::string arena_;
  std::vector<uint32_t> offsets_;
  std::vector<float> scores_;
  std::vector<uint32_t> attrs_;
  // Open-addressing hash table, a power of two in size: (hash >> 32) << 32 | (id + 1), 0 when empty.
  // The stored hash bits reject most wrong slots without touching the texts.
  std::vector<uint64_t> slots_;
  int32_t byte_tokens_[256];

  // Special tokens (control, user-defined, unknown) in llama.cpp's matching order: longest first.
  std::vector<int32_t> specials_;
  // Byte trie over the special texts: node 0 is the root; `rank` indexes specials_ or is -1.
  struct TrieNode {
    int32_t first_child = -1, next_sibling = -1, rank = -1;
    uint8_t byte = 0;
  };
  std::vector<TrieNode> trie_;
  int32_t root_child_[256];

  int32_t bos_ = kNoToken, eos_ = kNoToken, eot_ = kNoToken, eom_ = kNoToken, unk_ = kNoToken,
          pad_ = kNoToken;
  bool add_bos_ = true, add_eos_ = false;
  std::vector<int32_t> eog_ids_;
};

}  // namespace xpert
