// Gated DeltaNet on the CPU: the reference of backend/gated_delta_net.h's op and its kernels, recurrent and
// chunked (the WY / UT-transform form of fla and transformers' torch_chunk_gated_delta_rule).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/gated_delta_net.h"
#include "base/thread_pool.h"

namespace xpert::cpu {

void delta_rule_recurrent(const GdnShape& s, const DeltaRuleArgs& a, ThreadPool& pool);
void delta_rule_chunked(const GdnShape& s, const DeltaRuleArgs& a, ThreadPool& pool, int64_t chunk = 64);

// out[t][c] = silu(sum_j window[t + j][c] * w[c][j]), window = conv_state rows then x rows; afterwards
// conv_state holds the last d_conv-1 rows of the window. x, out: [T][C]; conv_state: [d_conv-1][C];
// w: [C][d_conv]. out may not alias x.
void causal_conv1d_silu(const float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t d_conv,
                        float* conv_state, float* out);

// x / sqrt(sum(x^2) + eps) per row of n (llama.cpp's build_gdn_l2_norm), in place.
void l2_norm_rows(float* x, int64_t rows, int64_t n, float eps);

struct GdnScratch {
  std::vector<float> conv_out, g, beta;
};

// One sequence through the mixer up to (excluding) the output projection: out [T][value_dim].
// conv_state / ssm_state are that sequence's state for this layer (see GdnShape for sizes).
void gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in, float* conv_state,
                     float* ssm_state, float* out, GdnScratch& scratch, ThreadPool& pool,
                     DeltaRuleForm form = DeltaRuleForm::automatic);

}  // namespace xpert::cpu
