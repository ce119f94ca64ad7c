// Sampling under a grammar. The sampler draws from the full distribution first; when the grammar takes
// that token (the usual case for a model that follows its instructions) it is kept, which is exact for
// greedy decoding and costs one short match. Otherwise the logits of every token the grammar forbids
// are set to -inf (the mask of the grammar state, cached per state: see GrammarMatcher::allowed_tokens)
// and the sampler draws again. End-of-generation tokens are allowed exactly when the text so far is a
// complete sentence of the grammar.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sample/grammar.h"
#include "sample/sampler.h"

namespace xpert {

class GrammarSampler {
 public:
  // `trie` (the vocabulary's pieces) must outlive this object; `eog_ids`: the end-of-generation tokens.
  // `tables`: what earlier requests with this grammar learned (see GrammarTables); null: start afresh.
  // `start_after` non-empty: lazy. The draws are free (only end of generation is refused) until the
  // output contains that text (a thinking model's "</think>"); the grammar takes what follows it, less
  // the whitespace right after it (the rest of that token, and up to two tokens of only whitespace:
  // they stay in the output).
  GrammarSampler(std::shared_ptr<const Grammar> grammar, const TokenTrie& trie, std::vector<int32_t> eog_ids,
                 std::shared_ptr<GrammarTables> tables = nullptr, std::string start_after = {});

  // The next token, already accepted by the grammar; -1 when no token may come (the vocabulary cannot
  // spell what the grammar needs, or logit_bias banned all of it). Throws GrammarError when the grammar
  // is too ambiguous to follow.
  int32_t sample(Sampler& sampler, std::span<const float> logits);
  // The grammar is complete and nothing may follow: generation is over.
  bool finished() const { return !waiting() && matcher_.finished(); }
  // Lazy and its start text not yet generated.
  bool waiting() const { return !start_after_.empty(); }
  const GrammarMatcher& matcher() const { return matcher_; }
  // Counters: draws, and draws the grammar refused (each cost a masked second draw).
  int64_t n_draws() const { return n_draws_; }
  int64_t n_masked() const { return n_masked_; }

 private:
  bool is_eog(int32_t id) const;
  bool try_accept(int32_t id);
  int32_t sample_waiting(Sampler& sampler, std::span<const float> logits);
  bool is_blank(int32_t id) const;  // a token of only whitespace

  GrammarMatcher matcher_;
  const TokenTrie& trie_;
  std::vector<int32_t> eog_ids_;
  std::vector<float> masked_;
  std::string start_after_, seen_;  // lazy: the start text (empty once seen), the output's last bytes
  int settle_left_ = 0;             // lazy: whitespace tokens still let through after the start text
  int64_t n_draws_ = 0, n_masked_ = 0;
};

}  // namespace xpert
