// The vocabulary-independent half of tokenization: loading, the piece index, special-token
// partitioning, pieces, and the end-of-generation set. Behaviour follows llama.cpp's llama-vocab.cpp
// (the compatibility target); tests/unit/test_tokenizer_reference.cpp checks it against llama.cpp.
#include "text/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "base/log.h"
#include "format/gguf.h"
#include "text/pretokenize.h"
#include "text/tokenizer_models.h"

namespace xpert {

namespace {

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a: pieces are short, so a byte loop is fast enough
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  h ^= h >> 33;  // a final mix, so that both the low bits (slot) and the high bits (tag) are good
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

// Token texts that end generation in llama.cpp even when the file names no id for them; they are
// promoted to control tokens, which also means they are only split out of text with parse_special.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>" /* DeepSeek */,
    "[e~[",
};
// End-of-turn candidates, used when tokenizer.ggml.eot_token_id is absent.
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>",         "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>",    "<EOT>",      "_<EOT>",  "[EOT]",         "<｜end▁of▁sentence｜>" /* DeepSeek */,
    "<end_of_utterance>",
};
// Fill-in-the-middle padding / repository / file separators also end generation.
constexpr std::string_view kFimEogTexts[] = {
    "<|fim_pad|>",  "<fim-pad>",     "<fim_pad>",  "<PAD>",  "[PAD]",                       // pad
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",  // rep, sep
};

template <size_t N>
bool is_one_of(std::string_view s, const std::string_view (&list)[N]) {
  return std::find(std::begin(list), std::end(list), s) != std::end(list);
}

}  // namespace

uint32_t attr_of_type(TokenType t) {
  switch (t) {
    case TokenType::normal:
      return kAttrNormal;
    case TokenType::unknown:
      return kAttrUnknown;
    case TokenType::control:
      return kAttrControl;
    case TokenType::user_defined:
      return kAttrUserDefined;
    case TokenType::unused:
      return kAttrUnused;
    case TokenType::byte:
      return kAttrByte;
    case TokenType::undefined:
      return kAttrUndefined;
  }
  return kAttrUndefined;
}

struct Tokenizer::Segment {
  size_t begin = 0, size = 0;  // raw text, when token == kNoToken
  int32_t token = kNoToken;
};

// ---------------------------------------------------------------------------------------------------
// Loading

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::GGUFFile& file) {
  Vocab v;
  std::optional<std::string> model = file.get_string("tokenizer.ggml.model");
  if (!model) fail("{}: no tokenizer.ggml.model: the file carries no vocabulary", file.path());
  v.model = *model;
  v.pre = file.get_string("tokenizer.ggml.pre").value_or("default");

  const gguf::Value* tokens = file.find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != gguf::ValueType::ARRAY || tokens->elem != gguf::ValueType::STRING)
    fail("{}: tokenizer.ggml.tokens is missing or not an array of strings", file.path());
  v.texts = tokens->strings;
  const size_t n = v.texts.size();

  if (const gguf::Value* scores = file.find("tokenizer.ggml.scores")) {
    if (scores->type != gguf::ValueType::ARRAY || scores->count < n)
      fail("{}: tokenizer.ggml.scores must be a numeric array of {} entries", file.path(), n);
    v.scores.resize(n);
    for (size_t i = 0; i < n; ++i) v.scores[i] = static_cast<float>(scores->number_at(i));
  }
  if (const gguf::Value* types = file.find("tokenizer.ggml.token_type")) {
    if (types->type != gguf::ValueType::ARRAY || types->count < n)
      fail("{}: tokenizer.ggml.token_type must be an integer array of {} entries", file.path(), n);
    v.types.resize(n);
    for (size_t i = 0; i < n; ++i) v.types[i] = static_cast<TokenType>(types->int_at(i));
  }

  if (v.model == "llama") {  // llama.cpp's defaults for SentencePiece vocabularies
    v.bos = 1, v.eos = 2, v.unk = 0;
    v.add_bos = true, v.add_eos = false, v.add_space_prefix = true;
  }
  if (v.model == "gpt2") {  // llama.cpp's defaults for byte-level BPE vocabularies
    const gguf::Value* merges = file.find("tokenizer.ggml.merges");
    if (!merges || merges->type != gguf::ValueType::ARRAY || merges->elem != gguf::ValueType::STRING)
      fail("{}: tokenizer.ggml.merges is missing or not an array of strings", file.path());
    v.merges = merges->strings;
    v.bos = 11, v.eos = 11, v.unk = kNoToken;
    const PreTokenizerSpec* pre = find_pre_tokenizer(v.pre);
    v.add_bos = pre && pre->add_bos, v.add_eos = false, v.add_space_prefix = false;
  }
  // An id the file gives but the vocabulary does not have keeps the default, as in llama.cpp.
  auto read_id = [&](const char* key, int32_t& id) {
    std::optional<int64_t> value = file.get_int(key);
    if (!value) return;
    if (*value < 0 || *value >= static_cast<int64_t>(n)) {
      log::warn("{}: {} = {} is outside the vocabulary of {} tokens; ignored", file.path(), key, *value, n);
      return;
    }
    id = static_cast<int32_t>(*value);
  };
  read_id("tokenizer.ggml.bos_token_id", v.bos);
  read_id("tokenizer.ggml.eos_token_id", v.eos);
  read_id("tokenizer.ggml.unknown_token_id", v.unk);
  read_id("tokenizer.ggml.padding_token_id", v.pad);
  read_id("tokenizer.ggml.eot_token_id", v.eot);
  read_id("tokenizer.ggml.eom_token_id", v.eom);
  v.add_bos = file.get_bool("tokenizer.ggml.add_bos_token").value_or(v.add_bos);
  v.add_eos = file.get_bool("tokenizer.ggml.add_eos_token").value_or(v.add_eos);
  v.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix").value_or(v.add_space_prefix);
  return create(std::move(v));
}

std::unique_ptr<Tokenizer> Tokenizer::create(Vocab vocab) {
  if (vocab.model == "llama") return make_spm_tokenizer(std::move(vocab));
  if (vocab.model == "gpt2") return make_bpe_tokenizer(std::move(vocab));
  fail("tokenizer model '{}' is not supported (supported: 'llama', 'gpt2')", vocab.model);
}

Tokenizer::Tokenizer(Vocab&& v) : model_(std::move(v.model)) {
  const size_t n = v.texts.size();
  if (n == 0) fail("the vocabulary is empty");
  if (n >= static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail("the vocabulary has {} tokens, more than this build supports", n);
  if (!v.scores.empty() && v.scores.size() != n)
    fail("the vocabulary has {} scores for {} tokens", v.scores.size(), n);
  if (!v.types.empty() && v.types.size() != n)
    fail("the vocabulary has {} token types for {} tokens", v.types.size(), n);

  offsets_.reserve(n + 1);
  offsets_.push_back(0);
  for (size_t i = 0; i < n; ++i) {
    // llama.cpp renames empty pieces so that every text is unique and non-empty.
    if (v.texts[i].empty()) v.texts[i] = "[EMPTY_" + std::to_string(i) + "]";
    arena_ += v.texts[i];
    if (arena_.size() > std::numeric_limits<uint32_t>::max()) fail("the vocabulary's texts exceed 4 GiB");
    offsets_.push_back(static_cast<uint32_t>(arena_.size()));
  }
  v.texts = {};
  scores_ = v.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(v.scores);
  attrs_.resize(n);
  for (size_t i = 0; i < n; ++i) attrs_[i] = v.types.empty() ? kAttrNormal : attr_of_type(v.types[i]);
  build_index();

  auto checked = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < n ? id : kNoToken; };
  bos_ = checked(v.bos), eos_ = checked(v.eos), unk_ = checked(v.unk), pad_ = checked(v.pad);
  add_bos_ = v.add_bos, add_eos_ = v.add_eos, add_space_prefix_ = v.add_space_prefix;
  if (add_bos_ && bos_ == kNoToken) fail("the vocabulary asks for a BOS token (add_bos_token) but has none");
  if (add_eos_ && eos_ == kNoToken) fail("the vocabulary asks for an EOS token (add_eos_token) but has none");

  find_eog_tokens(checked(v.eot), checked(v.eom));

  for (int b = 0; b < 256; ++b) {
    int32_t id = lookup(fmt::format("<0x{:02X}>", b));
    if (id == kNoToken) id = lookup(std::string(1, static_cast<char>(b)));
    byte_tokens_[b] = id == kNoToken ? unk_ : id;
  }
  build_special_matcher();
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::build_index() {
  size_t size = 1;
  while (size < 4 * static_cast<size_t>(n_vocab())) size <<= 1;  // load <= 1/4: short probes
  slots_.assign(size, 0);
  const size_t mask = size - 1;
  for (int32_t id = 0; id < n_vocab(); ++id) {
    const std::string_view text = token_text(id);
    const uint64_t h = hash_bytes(text);
    size_t i = h & mask;
    for (; slots_[i] != 0; i = (i + 1) & mask) {
      const auto other = static_cast<int32_t>(slots_[i] & 0xffffffffu) - 1;
      if (token_text(other) == text)
        fail("duplicate token in vocabulary: '{}' has ids {} and {}", text, other, id);
    }
    slots_[i] = (h & ~uint64_t{0xffffffffu}) | static_cast<uint64_t>(id + 1);
  }
}

int32_t Tokenizer::lookup(std::string_view text) const {
  const uint64_t h = hash_bytes(text);
  const uint64_t tag = h & ~uint64_t{0xffffffffu};
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask; slots_[i] != 0; i = (i + 1) & mask) {
    if ((slots_[i] & ~uint64_t{0xffffffffu}) != tag) continue;
    const auto id = static_cast<int32_t>(slots_[i] & 0xffffffffu) - 1;
    const uint32_t begin = offsets_[id], size = offsets_[id + 1] - begin;
    if (size == text.size() && std::memcmp(arena_.data() + begin, text.data(), size) == 0) return id;
  }
  return kNoToken;
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  int32_t id = lookup(text);
  if (id == kNoToken) return std::nullopt;
  return id;
}

std::string_view Tokenizer::token_text(int32_t id) const {
  if (!valid(id)) fail("token id {} is outside the vocabulary of {} tokens", id, n_vocab());
  return std::string_view(arena_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

// Which tokens end generation, found as llama.cpp finds them (by id where the file says, by text
// otherwise), including its fix-ups of token attributes; the special-token order depends on them.
void Tokenizer::find_eog_tokens(int32_t eot_hint, int32_t eom_hint) {
  auto promote = [&](int32_t id) {
    if (!(attrs_[id] & kAttrControl)) {
      log::debug("tokenizer: token {} '{}' ends generation; treating it as a control token", id,
                 token_text(id));
      attrs_[id] |= kAttrControl;
    }
  };
  auto first_of = [&](auto& list) {
    int32_t best = kNoToken;
    for (std::string_view t : list) {
      int32_t id = lookup(t);
      if (id != kNoToken && (best == kNoToken || id < best)) best = id;
    }
    return best;
  };

  eot_ = eot_hint != kNoToken ? eot_hint : first_of(kEotTexts);
  if (eot_hint == kNoToken && eot_ != kNoToken) promote(eot_);
  eom_ = eom_hint;
  if (eom_ == kNoToken) {
    eom_ = lookup("<|eom_id|>");
    if (eom_ != kNoToken) promote(eom_);
  }

  std::vector<int32_t> eog;
  for (std::string_view t : kFimEogTexts) {
    int32_t id = lookup(t);
    if (id != kNoToken) promote(id), eog.push_back(id);
  }
  for (int32_t id = 0; id < n_vocab(); ++id) {
    std::string_view text = token_text(id);
    if ((attrs_[id] & kAttrControl) && text.find("unused") != std::string_view::npos)
      attrs_[id] |= kAttrUnused;
    if (is_one_of(text, kEogTexts)) promote(id), eog.push_back(id);
    // gpt-oss's channel markers are printed even without `special`.
    if (text == "<|channel|>" || text == "<|message|>" || text == "<|start|>" || text == "<|constrain|>")
      attrs_[id] = kAttrUserDefined;
  }
  for (int32_t id : {eos_, eot_, eom_}) {
    if (id != kNoToken) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());

  auto has = [&](std::string_view t) {
    return std::any_of(eog.begin(), eog.end(), [&](int32_t id) { return token_text(id) == t; });
  };
  auto drop = [&](std::string_view t, uint32_t new_attr) {
    for (size_t i = 0; i < eog.size(); ++i) {
      if (token_text(eog[i]) == t) {
        attrs_[eog[i]] = new_attr;
        eog.erase(eog.begin() + static_cast<ptrdiff_t>(i));
        return;
      }
    }
  };
  // Harmony / solar-open: "<|end|>" closes a message, not the generation.
  if (has("<|end|>") && ((has("<|return|>") && has("<|call|>")) ||
                         ((has("<|call|>") || has("<|calls|>")) && has("<|flush|>")))) {
    drop("<|end|>", kAttrUserDefined);
  }
  // Gemma 4 and PLaMo have an ordinary "</s>".
  if (has("</s>") && (has("<|tool_response>") || has("<|plamo:eos|>"))) drop("</s>", kAttrNormal);
  eog_ids_ = std::move(eog);
}

bool Tokenizer::is_eog(int32_t id) const {
  return id != kNoToken && std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

// ---------------------------------------------------------------------------------------------------
// Special-token partitioning
//
// llama.cpp takes the special tokens longest first and, for each, splits every remaining stretch of
// raw text at each leftmost non-overlapping occurrence. Done literally that costs
// n_special x text_size (6414 x 10 MB for Gemma). Here one pass over the text with a byte trie finds
// which special tokens occur at all; only those are then placed, in the same order and with the same
// leftmost rule, over a coverage map. The result is the same partition.

void Tokenizer::build_special_matcher() {
  for (int32_t id = 0; id < n_vocab(); ++id) {
    if (attrs_[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) specials_.push_back(id);
  }
  // llama.cpp uses std::sort with this comparator, so tokens of equal length keep libstdc++'s
  // introsort order; calling the same sort on the same input reproduces it. It only matters for
  // equal-length tokens whose occurrences overlap, which no vocabulary seen so far has.
  std::sort(specials_.begin(), specials_.end(),
            [&](int32_t a, int32_t b) { return token_text(a).size() > token_text(b).size(); });

  trie_.assign(1, TrieNode{});
  std::fill(std::begin(root_child_), std::end(root_child_), -1);
  for (size_t rank = 0; rank < specials_.size(); ++rank) {
    std::string_view text = token_text(specials_[rank]);
    int32_t node = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto byte = static_cast<uint8_t>(text[i]);
      int32_t child = node == 0 ? root_child_[byte] : trie_[node].first_child;
      if (node != 0) {
        while (child != -1 && trie_[child].byte != byte) child = trie_[child].next_sibling;
      }
      if (child == -1) {
        child = static_cast<int32_t>(trie_.size());
        TrieNode fresh;
        fresh.byte = byte;
        if (node == 0) {
          root_child_[byte] = child;
        } else {
          fresh.next_sibling = trie_[node].first_child;
          trie_[node].first_child = child;
        }
        trie_.push_back(fresh);
      }
      node = child;
    }
    trie_[node].rank = static_cast<int32_t>(rank);  // texts are unique, so this is set once
  }
}

void Tokenizer::partition(std::string_view text, bool parse_special, std::vector<Segment>& out,
                          std::span<const std::pair<size_t, size_t>> literal) const {
  out.clear();
  const size_t n = text.size();
  const size_t n_specials = specials_.size();
  auto active = [&](int32_t rank) {
    return parse_special || !(attrs_[specials_[rank]] & (kAttrControl | kAttrUnknown));
  };
  // in_literal[p]: literal bytes before p; a control token may not cover any.
  std::vector<uint32_t> in_literal;
  if (!literal.empty()) {
    in_literal.assign(n + 1, 0);
    std::vector<uint8_t> mark(n, 0);
    for (auto [b, e] : literal)
      for (size_t k = std::min(b, n); k < std::min(e, n); ++k) mark[k] = 1;
    for (size_t k = 0; k < n; ++k) in_literal[k + 1] = in_literal[k] + mark[k];
  }
  auto allowed = [&](int32_t rank, size_t p) {
    if (in_literal.empty() || !(attrs_[specials_[rank]] & (kAttrControl | kAttrUnknown))) return true;
    const size_t len = token_text(specials_[rank]).size();
    return in_literal[std::min(p + len, n)] == in_literal[p];
  };
  // Calls visit(rank, position) for every occurrence of an active special token, by position.
  auto scan = [&](auto&& visit) {
    for (size_t p = 0; p < n; ++p) {
      int32_t node = root_child_[static_cast<uint8_t>(text[p])];
      for (size_t q = p + 1; node != -1; ++q) {
        const int32_t rank = trie_[node].rank;
        if (rank >= 0 && active(rank) && allowed(rank, p)) visit(rank, p);
        if (q == n) break;
        const auto byte = static_cast<uint8_t>(text[q]);
        node = trie_[node].first_child;
        while (node != -1 && trie_[node].byte != byte) node = trie_[node].next_sibling;
      }
    }
  };

  // 1. Count the occurrences of each special token.
  std::vector<size_t> count(n_specials + 1, 0);
  size_t total = 0;
  scan([&](int32_t rank, size_t) { ++count[rank], ++total; });
  if (total == 0) {
    if (n > 0) out.push_back({0, n, kNoToken});
    return;
  }

  // 2. Place them in priority order; an occurrence is taken if it overlaps nothing taken before and
  // starts after the previous taken occurrence of the same token.
  std::vector<uint8_t> covered(n, 0);
  std::vector<Segment> taken;
  // Takes the occurrence at m, or returns the last covered byte inside it (every occurrence starting
  // at or before that byte overlaps it, too).
  constexpr size_t kTaken = std::numeric_limits<size_t>::max();
  auto try_take = [&](int32_t rank, size_t m, size_t len) {
    for (size_t k = m + len; k-- > m;) {
      if (covered[k]) return k;
    }
    std::memset(&covered[m], 1, len);
    taken.push_back({m, len, specials_[rank]});
    return kTaken;
  };

  // Usually the occurrences are few and are listed once, grouped by token. Text made of long runs
  // of one character matches many nested tokens at every byte; then each occurring token searches
  // the text instead, which needs no memory.
  constexpr size_t kListBudget = 1u << 22;
  if (total <= n + kListBudget) {
    std::vector<size_t> start(n_specials + 1, 0);  // start[rank]: first slot of the token's list
    for (size_t r = 0; r < n_specials; ++r) start[r + 1] = start[r] + count[r];
    std::vector<size_t> positions(total);
    std::vector<size_t> fill(start.begin(), start.end() - 1);
    scan([&](int32_t rank, size_t p) { positions[fill[rank]++] = p; });
    for (size_t r = 0; r < n_specials; ++r) {
      const size_t len = token_text(specials_[r]).size();
      size_t next = 0;
      for (size_t i = start[r]; i < start[r + 1]; ++i) {
        const size_t m = positions[i];
        if (m >= next && try_take(static_cast<int32_t>(r), m, len) == kTaken) next = m + len;
      }
    }
  } else {
    for (size_t r = 0; r < n_specials; ++r) {
      if (count[r] == 0) continue;
      const std::string_view needle = token_text(specials_[r]);
      for (size_t pos = 0;;) {
        const size_t m = text.find(needle, pos);
        if (m == std::string_view::npos) break;
        if (!allowed(static_cast<int32_t>(r), m)) {
          pos = m + 1;
          continue;
        }
        const size_t blocked = try_take(static_cast<int32_t>(r), m, needle.size());
        pos = blocked == kTaken ? m + needle.size() : blocked + 1;
      }
    }
  }

  std::sort(taken.begin(), taken.end(), [](const Segment& a, const Segment& b) { return a.begin < b.begin; });
  size_t at = 0;
  for (const Segment& s : taken) {
    if (s.begin > at) out.push_back({at, s.begin - at, kNoToken});
    out.push_back(s);
    at = s.begin + s.size;
  }
  if (at < n) out.push_back({at, n - at, kNoToken});
}

// ---------------------------------------------------------------------------------------------------
// Encoding and pieces

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  return encode_parts(text, add_special, parse_special, {});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       std::span<const std::pair<size_t, size_t>> literal) const {
  return encode_parts(text, add_special, true, literal);
}

std::vector<std::pair<size_t, size_t>> Tokenizer::control_spans(std::string_view text) const {
  std::vector<Segment> segments;
  partition(text, true, segments);
  std::vector<std::pair<size_t, size_t>> out;
  for (const Segment& s : segments)
    if (s.token != kNoToken && (attrs_[s.token] & (kAttrControl | kAttrUnknown)))
      out.emplace_back(s.begin, s.begin + s.size);
  return out;
}

std::vector<int32_t> Tokenizer::encode_parts(std::string_view text, bool add_special, bool parse_special,
                                             std::span<const std::pair<size_t, size_t>> literal) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && add_bos_) out.push_back(bos_);
  std::vector<Segment> segments;
  partition(text, parse_special, segments, literal);
  bool after_special = true;  // SentencePiece prefixes the first run of text with a space, too
  for (const Segment& s : segments) {
    if (s.token != kNoToken) {
      out.push_back(s.token);
      after_special = true;
    } else {
      encode_text(text.substr(s.begin, s.size), after_special, out);
      after_special = false;
    }
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

void Tokenizer::append_piece(int32_t id, bool special, std::string& out) const {
  if (!valid(id)) fail("token id {} is outside the vocabulary of {} tokens", id, n_vocab());
  const uint32_t attr = attrs_[id];
  if (!special && (attr & (kAttrControl | kAttrUnknown))) return;
  if (attr & (kAttrControl | kAttrUnknown | kAttrUserDefined)) {
    out += token_text(id);
  } else if (attr & kAttrNormal) {
    append_normal_piece(id, out);
  } else if (attr & kAttrByte) {
    std::string_view t = token_text(id);  // "<0xXX>"
    if (t.size() != 6 || t.substr(0, 3) != "<0x") fail("byte token {} has text '{}', expected <0xXX>", id, t);
    out += static_cast<char>(std::stoi(std::string(t.substr(3, 2)), nullptr, 16));
  }
  // Unused and undefined tokens print nothing, as in llama.cpp.
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  std::string out;
  append_piece(id, special, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool special) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const size_t start = out.size();
    append_piece(ids[i], special, out);
    // Undo the space SentencePiece put in front of the text (llama_detokenize's lstrip of one space).
    if (i == 0 && add_space_prefix_ && out.size() > start && out[start] == ' ') out.erase(start, 1);
  }
  return out;
}

}  // namespace xpert
