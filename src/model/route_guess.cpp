#include "model/route_guess.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "backend/experts.h"

namespace xpert {
namespace {

// The `count` best experts for router . v, best first, ranked as the routing ranks them (route_top_k).
std::vector<int32_t> top(const ModelConfig& c, const LayerWeights& l, const float* v, int64_t count) {
  const int64_t E = c.n_embd, X = c.n_expert;
  const float* r = l.ffn_gate_inp.f32();
  std::vector<float> logit(X);
  for (int64_t e = 0; e < X; ++e) {
    double s = 0;
    for (int64_t i = 0; i < E; ++i) s += (double)r[e * E + i] * v[i];
    logit[e] = (float)s;
  }
  Routing routing;
  route_top_k(logit.data(), 1, {.n_expert = X, .k = std::min(count, X)}, routing);
  return routing.ids;
}

}  // namespace

RouteGuess* RouteGuess::get() {
  static const bool on = [] {
    const char* e = std::getenv("XPERT_ROUTE_GUESS");
    return e && std::strcmp(e, "1") == 0;
  }();
  if (!on) return nullptr;
  static RouteGuess g;  // prints when the program ends
  return &g;
}

void RouteGuess::guess(const ModelConfig& c, const LayerWeights& l, const float* ffn_norm, const float* x,
                       int64_t n) {
  guessed_.clear();
  if (l.ffn_gate_inp.type != DType::F32 || c.n_expert_used < 1) return;
  width_ = std::min(kWidths[kMaxWidth - 1] * c.n_expert_used / 2, c.n_expert);
  std::vector<float> v(c.n_embd);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < c.n_embd; ++i) v[i] = x[t * c.n_embd + i] * (ffn_norm ? ffn_norm[i] : 1.0f);
    const std::vector<int32_t> g = top(c, l, v.data(), width_);
    guessed_.insert(guessed_.end(), g.begin(), g.end());
  }
}

void RouteGuess::check(const ModelConfig& c, const LayerWeights& l, int64_t il, const float* cur, int64_t n) {
  const int64_t k = c.n_expert_used;
  if (guessed_.size() != (size_t)(n * width_)) return;
  if ((int64_t)chosen_.size() <= il) hits_.resize(il + 1), chosen_.resize(il + 1);
  for (int64_t t = 0; t < n; ++t) {
    const auto g = guessed_.begin() + t * width_;
    for (int32_t e : top(c, l, cur + t * c.n_embd, k))
      for (int w = 0; w < kMaxWidth; ++w)
        hits_[il][w] += std::count(g, g + std::min(kWidths[w] * k / 2, width_), e) ? 1 : 0;
    chosen_[il] += k;
  }
  guessed_.clear();
}

RouteGuess::~RouteGuess() {
  const int64_t chosen = std::accumulate(chosen_.begin(), chosen_.end(), int64_t{0});
  if (chosen == 0) return;
  std::fprintf(stderr,
               "XPERT_ROUTE_GUESS: of %lld chosen experts, guessed from the layer input:", (long long)chosen);
  for (int w = 0; w < kMaxWidth; ++w) {
    int64_t hits = 0;
    for (const auto& h : hits_) hits += h[w];
    std::fprintf(stderr, " %.1f %% in the best %.1f k,", 100.0 * (double)hits / (double)chosen,
                 kWidths[w] / 2.0);
  }
  std::fprintf(stderr, " by layer (best k):");
  for (size_t il = 0; il < hits_.size(); ++il)
    if (chosen_[il]) std::fprintf(stderr, " %.0f", 100.0 * (double)hits_[il][0] / (double)chosen_[il]);
  std::fprintf(stderr, "\n");
}

}  // namespace xpert
