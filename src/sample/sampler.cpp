#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace xpert {

// The first highest logit (NaN never wins; all NaN: 0). Two passes: the maximum over 8 independent
// running maxima (no chain through one compare per element: ~6x the one-pass loop on 152k logits), then
// the first index holding it.
int32_t argmax(std::span<const float> logits) {
  const size_t n = logits.size();
  const float* v = logits.data();
  constexpr size_t kLanes = 8;
  float m[kLanes];
  std::fill_n(m, kLanes, -std::numeric_limits<float>::infinity());
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) m[l] = v[i + l] > m[l] ? v[i + l] : m[l];
  for (; i < n; ++i) m[0] = v[i] > m[0] ? v[i] : m[0];
  const float mx = *std::max_element(m, m + kLanes);
  for (i = 0; i < n; ++i)
    if (v[i] == mx) return (int32_t)i;
  return 0;
}

Sampler::Sampler(const SamplingParams& p) : p_(p) {
  rng_.seed(p.seed == 0xFFFFFFFF ? std::random_device{}() : p.seed);
}

void Sampler::reset() { history_.clear(); }

void Sampler::accept(int32_t token) {
  history_.push_back(token);
  const size_t keep = (size_t)std::max(p_.penalty_last_n, 0);
  if (history_.size() > keep * 2 + 64) history_.erase(history_.begin(), history_.end() - keep);
}

std::vector<TokenProb> Sampler::top_n(std::span<const float> logits, int n) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp((double)l - mx);
  const double lse = mx + std::log(sum);
  std::vector<TokenProb> all(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) all[i] = {(int32_t)i, logits[i], (float)std::exp(logits[i] - lse)};
  n = std::min<int>(n, (int)all.size());
  std::partial_sort(all.begin(), all.begin() + n, all.end(),
                    [](const TokenProb& a, const TokenProb& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); });
  all.resize(n);
  return all;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (!p_.logit_bias.empty()) {
    biased_.assign(logits.begin(), logits.end());
    for (auto [id, bias] : p_.logit_bias)
      if (id >= 0 && (size_t)id < biased_.size())
        biased_[id] = bias <= -100.0f ? -std::numeric_limits<float>::infinity() : biased_[id] + bias;
    logits = biased_;
  }
  const bool penalize = p_.presence_penalty != 0 || p_.frequency_penalty != 0 || p_.repeat_penalty != 1.0f;
  if (p_.temperature <= 0 && !penalize) return argmax(logits);

  cand_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand_[i] = {(int32_t)i, logits[i], 0};
  if (penalize && !history_.empty()) {
    std::unordered_map<int32_t, int> counts;
    const size_t from = history_.size() > (size_t)p_.penalty_last_n ? history_.size() - p_.penalty_last_n : 0;
    for (size_t i = from; i < history_.size(); ++i) counts[history_[i]]++;
    for (auto [id, cnt] : counts) {
      if (id < 0 || id >= (int32_t)cand_.size()) continue;
      float& l = cand_[id].logit;
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
      l -= cnt * p_.frequency_penalty + p_.presence_penalty;
    }
  }
  if (p_.temperature <= 0) {
    return std::max_element(cand_.begin(), cand_.end(), [](const TokenProb& a, const TokenProb& b) {
             return a.logit < b.logit;
           })->id;
  }
  auto by_logit = [](const TokenProb& a, const TokenProb& b) { return a.logit > b.logit; };
  size_t n = cand_.size();
  if (p_.top_k > 0 && (size_t)p_.top_k < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = p_.top_k;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  auto softmax = [&](float temp) {
    const float mx = cand_[0].logit;
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += (cand_[i].prob = std::exp((cand_[i].logit - mx) / temp));
    for (size_t i = 0; i < n; ++i) cand_[i].prob = (float)(cand_[i].prob / sum);
  };
  softmax(1.0f);
  if (p_.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < n; ++i) {
      cum += cand_[i].prob;
      if (cum >= p_.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  if (p_.min_p > 0) {
    const float floor = cand_[0].prob * p_.min_p;
    size_t keep = 1;
    while (keep < n && cand_[keep].prob >= floor) ++keep;
    n = keep;
  }
  softmax(p_.temperature);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double r = u(rng_), cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += cand_[i].prob;
    if (r < cum) return cand_[i].id;
  }
  return cand_[n - 1].id;
}

}  // namespace xpert
