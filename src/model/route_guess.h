// XPERT_ROUTE_GUESS=1, a measurement knob for MoE models on the host backend: how many of a layer's chosen
// experts the router would already pick from the layer's *input* (the residual before attention or the
// Gated DeltaNet mixer), i.e. how well a GPU could start the chosen experts' weights into L2 while the
// attention half of the layer runs (docs/PERF.md, issue #7: on the H200 such a prefetch measured slower, so
// it was removed; the share stays a lead for host-resident experts). The guess scores experts with the router
// on x ⊙ (the FFN norm's weights): the norm's 1 / rms scales every logit of a token alike, so it does not
// change the ranking. Prints the share at exit, for guesses of k, 1.5 k and 2 k experts (a prefetch could
// take more than the k it needs).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace xpert {

class RouteGuess {
 public:
  static RouteGuess* get();  // null unless XPERT_ROUTE_GUESS=1
  // Before the mixer: x [n][n_embd] (the residual), ffn_norm the FFN norm's weights (may be null).
  void guess(const ModelConfig& c, const LayerWeights& l, const float* ffn_norm, const float* x, int64_t n);
  // The FFN input: cur [n][n_embd] (normalized); counts how many of the true top k were guessed.
  void check(const ModelConfig& c, const LayerWeights& l, int64_t il, const float* cur, int64_t n);
  ~RouteGuess();  // prints the shares, overall and by layer

 private:
  static constexpr int kMaxWidth = 3;
  static constexpr int64_t kWidths[kMaxWidth] = {2, 3, 4};  // guesses of k, 1.5 k, 2 k (in half k)
  std::vector<int32_t> guessed_;                            // [n][width_] of the layer in flight, best first
  int64_t width_ = 0;
  std::vector<std::array<int64_t, kMaxWidth>> hits_;  // by layer, by guess width
  std::vector<int64_t> chosen_;                       // by layer
};

}  // namespace xpert
