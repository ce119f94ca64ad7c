// Token sampling. temperature <= 0 is greedy (the first highest logit, as llama.cpp picks). Otherwise
// the llama.cpp default chain: penalties -> top-k -> top-p -> min-p -> temperature -> draw with `seed`.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace xpert {

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;       // <= 0: off
  float top_p = 0.95f;      // >= 1: off
  float min_p = 0.05f;      // <= 0: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repeat_penalty = 1.0f;
  int32_t penalty_last_n = 64;
  uint64_t seed = 0xFFFFFFFF;  // default: random
  // OpenAI's logit_bias: added to the token's logit before anything else; -100 or below bans the token.
  // Ids outside the vocabulary are ignored (the server refuses them).
  std::vector<std::pair<int32_t, float>> logit_bias;
};

struct TokenProb {
  int32_t id;
  float logit;
  float prob;  // after the chain; for greedy, softmax of the raw logits
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  int32_t sample(std::span<const float> logits);
  void accept(int32_t token);  // record for penalties
  void reset();
  // log-softmax of the raw logits, the n best (for logprobs).
  static std::vector<TokenProb> top_n(std::span<const float> logits, int n);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<int32_t> history_;
  std::vector<TokenProb> cand_;
  std::vector<float> biased_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace xpert
