// Shared by the model-level device tests (CUDA, OpenCL): a model's prefill logits and greedy continuation,
// and how two runs of it are compared.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/thread_pool.h"
#include "model/model.h"
#include "model/kv_cache.h"
#include "model/recurrent_state.h"

namespace xpert {

constexpr float kTieGap = 0.05f;  // a greedy divergence needs a near-tie: a gap under this, relative to max |logit|

inline std::string fixture(const std::string& name) {
  const char* e = std::getenv("XPERT_SOURCE_DIR");
  return std::string(e ? e : XPERT_SOURCE_DIR) + "/tests/reference/fixtures/" + name;
}

struct Outputs {
  std::vector<float> prefill;   // logits of every prompt position
  std::vector<int32_t> tokens;  // greedy continuation
  std::vector<std::vector<float>> step_logits;
};

inline int32_t argmax(const float* l, int64_t n) { return (int32_t)(std::max_element(l, l + n) - l); }

inline float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The prompt's logits, then n_gen greedy tokens one step at a time, in a cache of ctx rows.
inline Outputs run(const Model& m, const std::vector<int32_t>& prompt, int n_gen, ThreadPool& pool,
                   KvTypes types = {}, int64_t ctx = 128) {
  const ModelConfig& c = m.config();
  KvCache kv(c, ctx, 1, m.layer_devices(), types);
  std::unique_ptr<RecurrentState> st;
  if (c.has_recurrent_layers()) st = std::make_unique<RecurrentState>(c, 1, m.layer_devices());
  Outputs r;
  m.forward({.tokens = prompt, .pos0 = 0, .cache = &kv, .seq = 0, .all_logits = true, .state = st.get()}, r.prefill,
            pool);
  int32_t next = argmax(r.prefill.data() + (prompt.size() - 1) * c.n_vocab, c.n_vocab);
  int32_t pos = (int32_t)prompt.size();
  std::vector<float> logits;
  for (int i = 0; i < n_gen; ++i) {
    r.tokens.push_back(next);
    const int32_t tok[1] = {next};
    m.forward({.tokens = tok, .pos0 = pos++, .cache = &kv, .seq = 0, .all_logits = false, .state = st.get()},
              logits, pool);
    r.step_logits.push_back(logits);
    next = argmax(logits.data(), c.n_vocab);
  }
  return r;
}

// max |a - b| / max |a| over the prefill logits.
inline float prefill_rel_diff(const Outputs& a, const Outputs& b) {
  EXPECT_EQ(a.prefill.size(), b.prefill.size());
  float worst = 0;
  for (size_t i = 0; i < a.prefill.size() && i < b.prefill.size(); ++i)
    worst = std::max(worst, std::fabs(a.prefill[i] - b.prefill[i]));
  return worst / max_abs(a.prefill);
}

// How many greedy tokens b agrees with a on; where they part, a's logits for the two choices must be a
// near-tie (kTieGap of max |logit|). `what` prefixes the failure message.
inline size_t greedy_agreement(const Outputs& a, const Outputs& b, int64_t V, const std::string& what = "") {
  size_t agree = 0;
  while (agree < a.tokens.size() && agree < b.tokens.size() && a.tokens[agree] == b.tokens[agree]) ++agree;
  if (agree < a.tokens.size() && agree < b.tokens.size()) {
    const std::vector<float>& l = agree == 0 ? std::vector<float>(a.prefill.end() - V, a.prefill.end())
                                             : a.step_logits[agree - 1];
    const float gap = std::fabs(l[a.tokens[agree]] - l[b.tokens[agree]]) / max_abs(l);
    EXPECT_LT(gap, kTieGap) << what << (what.empty() ? "" : ": ") << "greedy diverges at token " << agree
                            << " without a near-tie";
  }
  return agree;
}

}  // namespace xpert
