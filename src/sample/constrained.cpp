#include "sample/constrained.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace xpert {

GrammarSampler::GrammarSampler(std::shared_ptr<const Grammar> grammar, const TokenTrie& trie,
                               std::vector<int32_t> eog_ids, std::shared_ptr<GrammarTables> tables,
                               std::string start_after)
    : matcher_(std::move(grammar), std::move(tables)),
      trie_(trie),
      eog_ids_(std::move(eog_ids)),
      start_after_(std::move(start_after)) {}

bool GrammarSampler::is_eog(int32_t id) const {
  return std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end();
}

bool GrammarSampler::try_accept(int32_t id) {
  if (id < 0 || id >= trie_.n_vocab()) return false;
  if (is_eog(id)) return matcher_.complete();
  const std::string& piece = trie_.piece(id);
  return !piece.empty() && matcher_.accept(piece);
}

int32_t GrammarSampler::sample_waiting(Sampler& sampler, std::span<const float> logits) {
  int32_t id = sampler.sample(logits);
  if (is_eog(id)) {  // the answer the grammar is for has not come yet
    masked_.assign(logits.begin(), logits.end());
    for (int32_t e : eog_ids_)
      if (e >= 0 && (size_t)e < masked_.size()) masked_[e] = -std::numeric_limits<float>::infinity();
    id = sampler.sample(masked_);
    if (std::isinf(masked_[(size_t)id])) return -1;
  }
  if (id < 0 || id >= trie_.n_vocab()) return id;
  seen_ += trie_.piece(id);
  const size_t at = seen_.find(start_after_);
  if (at == std::string::npos) {
    if (seen_.size() > start_after_.size()) seen_.erase(0, seen_.size() - start_after_.size());
    return id;
  }
  std::string_view rest = std::string_view(seen_).substr(at + start_after_.size());
  while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\n' || rest.front() == '\t' || rest.front() == '\r'))
    rest.remove_prefix(1);
  const bool ok = rest.empty() || matcher_.accept(rest);
  start_after_.clear();
  seen_.clear();
  settle_left_ = rest.empty() ? 2 : 0;
  return ok ? id : -1;
}

bool GrammarSampler::is_blank(int32_t id) const {
  if (id < 0 || id >= trie_.n_vocab() || is_eog(id)) return false;
  const std::string& p = trie_.piece(id);
  return !p.empty() && p.find_first_not_of(" \t\n\r") == std::string::npos;
}

int32_t GrammarSampler::sample(Sampler& sampler, std::span<const float> logits) {
  if (waiting()) return sample_waiting(sampler, logits);
  ++n_draws_;
  const int32_t first = sampler.sample(logits);
  if (settle_left_ > 0) {
    --settle_left_;
    if (is_blank(first)) return first;
    settle_left_ = 0;
  }
  if (try_accept(first)) return first;
  ++n_masked_;
  const std::vector<uint32_t>& allowed = matcher_.allowed_tokens(trie_);
  const size_t n = std::min(logits.size(), (size_t)trie_.n_vocab());
  masked_.assign(logits.size(), -std::numeric_limits<float>::infinity());
  for (size_t w = 0; w * 32 < n; ++w) {
    uint32_t bits = allowed[w];
    while (bits) {
      const size_t i = w * 32 + (size_t)__builtin_ctz(bits);
      bits &= bits - 1;
      if (i < n) masked_[i] = logits[i];
    }
  }
  if (matcher_.complete())
    for (int32_t e : eog_ids_)
      if (e >= 0 && (size_t)e < logits.size()) masked_[e] = logits[e];
  const int32_t id = sampler.sample(masked_);
  if (std::isinf(masked_[(size_t)id])) return -1;  // everything allowed was banned
  return try_accept(id) ? id : -1;
}

}  // namespace xpert
