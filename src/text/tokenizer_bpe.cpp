// Byte-level BPE (tokenizer.ggml.model = "gpt2"), as llama.cpp and Hugging Face tokenizers do it:
// the text is split into words by the pre-tokenizer regexes; each byte of a word starts as the token
// of its GPT-2 stand-in character (bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
// rest are moved to U+0100..U+0143), and the adjacent pair with the lowest merge rank is merged,
// again and again (equal ranks: the leftmost pair first). Words repeat a lot, so their ids are cached.
#include <algorithm>
#include <array>
#include <bit>
#include <limits>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "base/error.h"
#include "base/log.h"
#include "text/pretokenize.h"
#include "text/tokenizer_models.h"

namespace xpert {

namespace {

// GPT-2's bytes_to_unicode: the code point that stands for byte b.
uint32_t byte_to_cpt(uint8_t b) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      t[c] = printable ? static_cast<uint32_t>(c) : next++;
    }
    return t;
  }();
  return table[b];
}

void append_utf8(uint32_t cpt, std::string& out) {
  if (cpt < 0x80) {
    out += static_cast<char>(cpt);
  } else {  // stand-ins are below U+0800
    out += static_cast<char>(0xC0 | (cpt >> 6));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  }
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(Vocab&& vocab);

 protected:
  void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const override;
  void append_normal_piece(int32_t id, std::string& out) const override;

 private:
  struct Merge {
    int32_t rank, result;
  };
  const Merge* find_merge(int32_t left, int32_t right) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_short(std::vector<int32_t>& ids) const;
  void merge_long(std::vector<int32_t>& ids) const;

  int32_t byte_ids_[256];     // token of each byte's stand-in character, kNoToken when absent
  int16_t byte_of_cpt_[324];  // inverse of byte_to_cpt, -1 elsewhere
  // Open-addressing table of merges: key = left << 32 | right (both ids), empty = kEmpty.
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  std::vector<uint64_t> merge_keys_;
  std::vector<Merge> merge_values_;
  int merge_shift_ = 64;

  std::unique_ptr<PreTokenizer> pre_;
  bool ignore_merges_ = false;

  // Word (raw bytes) -> ids. Bounded: cleared when full.
  static constexpr size_t kCacheEntries = 1 << 18, kCacheWordBytes = 128;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

uint64_t merge_key(int32_t left, int32_t right) {
  return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
}

// Note: the base constructor consumes the token texts, scores and types of `v`; pre and merges stay.
BpeTokenizer::BpeTokenizer(Vocab&& v) : Tokenizer(std::move(v)) {
  add_space_prefix_ = false;  // byte-level BPE marks spaces itself
  const PreTokenizerSpec* spec = find_pre_tokenizer(v.pre);
  if (!spec)
    fail("tokenizer.ggml.pre = '{}' is not a pre-tokenizer this build knows (known: {})", v.pre,
         known_pre_tokenizers());
  pre_ = std::make_unique<PreTokenizer>(spec->regexes);
  ignore_merges_ = spec->ignore_merges;

  std::fill(std::begin(byte_of_cpt_), std::end(byte_of_cpt_), int16_t{-1});
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(byte_to_cpt(static_cast<uint8_t>(b)), s);
    byte_ids_[b] = lookup(s);
    byte_of_cpt_[byte_to_cpt(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
  }

  size_t size = 1;
  while (size < 2 * v.merges.size() + 2) size <<= 1;
  merge_keys_.assign(size, kEmpty);
  merge_values_.resize(size);
  merge_shift_ = 64 - std::countr_zero(size);
  size_t skipped = 0;
  std::string joined;
  for (size_t rank = 0; rank < v.merges.size(); ++rank) {
    const std::string_view m = v.merges[rank];
    const size_t space = m.find(' ', 1);  // a merge may start with a space stand-in only, never a space
    if (space == std::string_view::npos)
      fail("BPE merge {} ('{}') is not two pieces separated by a space", rank, m);
    const std::string_view a = m.substr(0, space), b = m.substr(space + 1);
    joined.assign(a).append(b);
    const int32_t left = lookup(a), right = lookup(b), result = lookup(joined);
    if (left == kNoToken || right == kNoToken || result == kNoToken) {
      ++skipped;  // a merge whose pieces are not tokens can never take part in an encoding
      continue;
    }
    const uint64_t key = merge_key(left, right);
    size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
    for (; merge_keys_[i] != kEmpty && merge_keys_[i] != key; i = (i + 1) & (size - 1)) {
    }
    if (merge_keys_[i] == key) continue;  // a repeated merge keeps its first (best) rank, as llama.cpp
    merge_keys_[i] = key;
    merge_values_[i] = {static_cast<int32_t>(rank), result};
  }
  if (skipped)
    log::debug("tokenizer: {} of {} BPE merges name pieces that are not tokens; ignored", skipped,
               v.merges.size());
}

const BpeTokenizer::Merge* BpeTokenizer::find_merge(int32_t left, int32_t right) const {
  if (left == kNoToken || right == kNoToken) return nullptr;
  const uint64_t key = merge_key(left, right);
  const size_t mask = merge_keys_.size() - 1;
  for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;; i = (i + 1) & mask) {
    if (merge_keys_[i] == key) return &merge_values_[i];
    if (merge_keys_[i] == kEmpty) return nullptr;
  }
}

// Short words: scan the pairs for the best one; no allocation beyond `ids`.
void BpeTokenizer::merge_short(std::vector<int32_t>& ids) const {
  while (ids.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max(), best_result = kNoToken;
    size_t best = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const Merge* m = find_merge(ids[i], ids[i + 1]);
      if (m && m->rank < best_rank) best_rank = m->rank, best_result = m->result, best = i;
    }
    if (best_result == kNoToken) return;
    ids[best] = best_result;
    ids.erase(ids.begin() + static_cast<ptrdiff_t>(best) + 1);
  }
}

// Long words (runs of spaces, long numbers without splitting): a heap of candidate pairs.
void BpeTokenizer::merge_long(std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id, prev, next;
  };
  struct Pair {
    int32_t rank, left, left_id, right_id;
    bool operator<(const Pair& o) const { return rank > o.rank || (rank == o.rank && left > o.left); }
  };
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<Symbol> sym(n);
  for (int32_t i = 0; i < n; ++i) sym[i] = {ids[i], i - 1, i + 1 == n ? -1 : i + 1};
  std::priority_queue<Pair> queue;
  auto push = [&](int32_t left) {
    if (left == -1 || sym[left].next == -1) return;
    const Symbol& l = sym[left];
    if (const Merge* m = find_merge(l.id, sym[l.next].id)) queue.push({m->rank, left, l.id, sym[l.next].id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    Symbol& l = sym[p.left];
    // Stale when either side has changed since the pair was queued (merged symbols get id kNoToken).
    if (l.id != p.left_id || l.next == -1 || sym[l.next].id != p.right_id) continue;
    const int32_t r = l.next;
    l.id = find_merge(p.left_id, p.right_id)->result;
    l.next = sym[r].next;
    if (l.next != -1) sym[l.next].prev = p.left;
    sym[r].id = kNoToken;
    push(l.prev);
    push(p.left);
  }
  ids.clear();
  for (int32_t i = 0; i != -1; i = sym[i].next) ids.push_back(sym[i].id);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    std::string mapped;
    for (char c : word) append_utf8(byte_to_cpt(static_cast<uint8_t>(c)), mapped);
    if (const int32_t id = lookup(mapped); id != kNoToken) return out.push_back(id);
  }
  std::vector<int32_t> ids(word.size());
  for (size_t i = 0; i < word.size(); ++i) ids[i] = byte_ids_[static_cast<uint8_t>(word[i])];
  if (ids.size() <= 64) {
    merge_short(ids);
  } else {
    merge_long(ids);
  }
  // A byte whose stand-in is not in the vocabulary produces nothing, as in llama.cpp.
  for (int32_t id : ids) {
    if (id != kNoToken) out.push_back(id);
  }
}

void BpeTokenizer::encode_text(std::string_view raw, bool, std::vector<int32_t>& out) const {
  std::string fixed;
  const std::string_view text = replace_invalid_utf8(raw, fixed) ? std::string_view(fixed) : raw;
  std::vector<std::string_view> words;
  pre_->split(text, words);
  std::vector<int32_t> ids;
  for (std::string_view word : words) {
    if (word.size() > kCacheWordBytes) {
      encode_word(word, out);
      continue;
    }
    {
      std::lock_guard lock(cache_mutex_);
      if (auto it = cache_.find(word); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    ids.clear();
    encode_word(word, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kCacheEntries) cache_.clear();
    cache_.emplace(word, ids);
  }
}

void BpeTokenizer::append_normal_piece(int32_t id, std::string& out) const {
  const std::string_view text = token_text(id);
  for (size_t at = 0; at < text.size();) {
    const auto b = static_cast<uint8_t>(text[at]);
    if (b < 0x80) {
      const int16_t byte = byte_of_cpt_[b];
      out += byte >= 0 ? static_cast<char>(byte) : static_cast<char>(b);
      ++at;
      continue;
    }
    if ((b & 0xE0) == 0xC0 && at + 1 < text.size()) {
      const uint32_t cpt = (b & 0x1Fu) << 6 | (static_cast<uint8_t>(text[at + 1]) & 0x3Fu);
      if (cpt < 324 && byte_of_cpt_[cpt] >= 0) {
        out += static_cast<char>(byte_of_cpt_[cpt]);
        at += 2;
        continue;
      }
    }
    out += text[at++];  // not a stand-in: copied as it is
  }
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab&& vocab) {
  return std::make_unique<BpeTokenizer>(std::move(vocab));
}

}  // namespace xpert
