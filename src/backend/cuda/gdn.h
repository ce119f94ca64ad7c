// Gated DeltaNet on a CUDA device, with the meaning of backend/gated_delta_net.h (same shapes, layouts and
// argument structs; every pointer in them device memory). Asynchronous on `stream`.
//
// The delta rule has the CPU's two forms:
//   recurrent - token by token (decode). One block per (value head, 32 state columns); the state slice
//               lives in registers for the whole call, so T tokens cost one state read and one write.
//   chunked   - prefill, chunks of 64 tokens in the WY / UT form of delta_rule_chunked. A first kernel
//               does everything that does not need the state for all chunks at once (decayed K K^T and
//               Q K^T, the triangular solve, u = T (beta v), w = T (beta e^G k)); a second walks the
//               chunks in order per (value head, 32 state columns), where the state is column-separable:
//               v_new = u - w S, o = e^G q S + (Q K^T) v_new, S = e^G_last S + (decayed K)^T v_new.
//               llama.cpp's GPU kernels run this token by token.
// All f32 (no tensor cores): results agree with the CPU's to float rounding.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/gated_delta_net.h"

namespace xpert::cuda {

// Rows (sequences) a launch of gated_delta_net_rows takes: their state pointers go in the kernel parameters.
constexpr int kGdnRowsPerLaunch = 64;

// out[t][c] = silu(sum_j window[t + j][c] * w[c][j]) over the conv state rows then x's; conv_state then
// holds the last d_conv-1 rows of the window. x, out: [T][C]; conv_state: [d_conv-1][C]; w: [C][d_conv].
void causal_conv1d_silu(const float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t d_conv,
                        float* conv_state, float* out, cudaStream_t stream);

// x / sqrt(sum(x^2) + eps) per head, in place: head h of token t at x + t * token_stride + h * head_dim.
void l2_norm_heads(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t token_stride,
                   float eps, cudaStream_t stream);

// g = softplus(alpha + dt_bias) * a, beta = sigmoid(beta_in); [T][n_v_heads] each.
void gdn_gates(const float* alpha, const float* beta_in, const float* dt_bias, const float* a, float* g,
               float* beta, int64_t n_tokens, int64_t n_v_heads, cudaStream_t stream);

// x = rmsnorm(x) * w * silu(z) for rows of n (w: [n]); with q, also x's q8_1 activations (matmul.h: int8
// [rows][n], float2 ds [rows][n / 32]; n % 32 == 0).
void gated_rmsnorm_silu(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps,
                        cudaStream_t stream, int8_t* q = nullptr, float2* ds = nullptr);

// One decode token: causal_conv1d_silu, l2_norm_heads of q and k and gdn_gates in one launch, the same bits
// (conv_out [conv_dim], g and beta [n_v_heads]). For head dims that are multiples of 32 up to 256 and up to
// 8 conv taps (gdn_decode_prelude_fusable); gated_delta_net takes it for T = 1 when it can.
bool gdn_decode_prelude_fusable(const GdnShape& s);
// Reads the conv state (and weights) before its PDL wait: the kernel right before must not write the conv
// state (in gated_delta_net the last call's delta rule and gated norm ran since its last writer).
void gdn_decode_prelude(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                        float* conv_state, float* conv_out, float* g, float* beta, cudaStream_t stream);

// state_settled: the kernel right before this launch does not write the state (gated_delta_net's prelude or
// gates ran since its last writer), so the kernel reads it before its PDL wait (launch.cuh).
// norm (optional): gated_rmsnorm_silu(a.out, norm->z, norm->w, n_tokens * n_v_heads, head_v_dim, eps, q, ds)
// folded in (the same bits), where gdn_recurrent_norm_fusable says the kernel takes it.
struct GatedNormArgs {
  const float* z;
  const float* w;
  float eps;
  int8_t* q = nullptr;
  float2* ds = nullptr;
};
bool gdn_recurrent_norm_fusable(const GdnShape& s);
void delta_rule_recurrent(const GdnShape& s, const DeltaRuleArgs& a, cudaStream_t stream,
                          bool state_settled = false, const GatedNormArgs* norm = nullptr);
// Whether the chunked kernels take this shape (head_k_dim 64 or 128, head_v_dim a multiple of 32 up to 128);
// delta_rule_chunked runs the recurrent form otherwise, and also when q / k rows are not 16-byte aligned.
bool delta_rule_chunked_supported(const GdnShape& s);
size_t delta_rule_chunked_workspace_bytes(const GdnShape& s, int64_t n_tokens);
void delta_rule_chunked(const GdnShape& s, const DeltaRuleArgs& a, void* workspace, cudaStream_t stream);

// The whole mixer for one sequence up to the output projection, as xpert::gated_delta_net: in.* and
// p.* device pointers, out [T][value_dim]. automatic = chunked from kChunkedMinTokens tokens. With out_q,
// out's q8_1 activations too (for the output projection; head_v_dim % 32 == 0).
size_t gated_delta_net_workspace_bytes(const GdnShape& s, int64_t n_tokens);
void gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in, float* conv_state,
                     float* ssm_state, float* out, void* workspace, cudaStream_t stream,
                     DeltaRuleForm form = DeltaRuleForm::automatic, int8_t* out_q = nullptr,
                     float2* out_ds = nullptr);

// gated_delta_net of in.n_tokens one-token sequences at once (decode of many streams): row r of in.* is a
// token of the sequence whose states are states[r]; out [rows][value_dim] (and out_q's rows). The same bits
// as gated_delta_net of each row alone; two launches per kGdnRowsPerLaunch rows where the prelude and the
// gated norm fold in (gdn_decode_prelude_fusable, gdn_recurrent_norm_fusable), else row by row. Workspace:
// gated_delta_net_workspace_bytes(s, rows).
void gated_delta_net_rows(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in,
                          std::span<const GdnSlotState> states, float* out, void* workspace,
                          cudaStream_t stream, int8_t* out_q = nullptr, float2* out_ds = nullptr);

}  // namespace xpert::cuda
