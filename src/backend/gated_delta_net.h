// Gated DeltaNet, the linear-attention mixer of Qwen3-Next / Qwen3.5 hybrid layers: the op's shapes and
// arguments, shared by every backend (cpu/gated_delta_net.h is the reference and CPU kernels). As llama.cpp
// computes it (src/models/delta-net-base.cpp, ggml's ssm_conv and gated_delta_net ops):
//
//   qkv = causal_conv1d(x W_qkv) over time (kernel d_conv, state = the last d_conv-1 inputs), then silu
//   q, k = L2-normalized per head (x / sqrt(sum x^2 + eps));  v as is
//   beta = sigmoid(x W_beta);  g = softplus(x W_alpha + dt_bias) * a   (a = -exp(A_log), so g < 0)
//   per head, state S [head_k_dim][head_v_dim]:
//     S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t / sqrt(head_k_dim)
//   y = rmsnorm(o) * w_norm * silu(z)   (per head), then the output projection (in the model file)
//
// The delta rule has two forms that compute the same thing: recurrent (token by token, for decode) and
// chunked (the WY / UT-transform form of fla and transformers' torch_chunk_gated_delta_rule, for
// prefill). Value head h reads key head h % n_k_heads (llama.cpp's GGUFs tile the key heads).
#pragma once
#include <cstdint>

#include "quant/dtype.h"

namespace xpert {

struct GdnShape {
  int64_t d_conv = 4;                      // conv kernel length
  int64_t n_k_heads = 0, n_v_heads = 0;    // ssm.group_count, ssm.time_step_rank
  int64_t head_k_dim = 0, head_v_dim = 0;  // ssm.state_size, ssm.inner_size / n_v_heads
  float eps = 1e-6f;                       // of the L2 norms and the gated RMS norm
  int64_t key_dim() const { return n_k_heads * head_k_dim; }
  int64_t value_dim() const { return n_v_heads * head_v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // channels: q | k | v
  int64_t conv_state_size() const { return (d_conv - 1) * conv_dim(); }
  int64_t ssm_state_size() const { return n_v_heads * head_k_dim * head_v_dim; }
};

// The delta rule over T tokens of one sequence.
//   q, k:  [T][n_k_heads][head_k_dim] (L2-normalized, q not yet scaled)
//   v:     [T][n_v_heads][head_v_dim]
//   g:     [T][n_v_heads] log decay (<= 0);  beta: [T][n_v_heads]
//   state: [n_v_heads][head_k_dim][head_v_dim], read and updated in place
//   out:   [T][n_v_heads][head_v_dim]
struct DeltaRuleArgs {
  const float *q, *k, *v, *g, *beta;
  float* state;
  float* out;
  int64_t n_tokens;
  int64_t qk_stride = 0, v_stride = 0;  // floats from one token's row to the next; 0: packed
};
enum class DeltaRuleForm { automatic, recurrent, chunked };
// automatic: chunked from this many tokens of one sequence, recurrent below.
constexpr int64_t kChunkedMinTokens = 2;

// The per-token inputs of one recurrent layer for one sequence, after the batch's projections.
struct GdnLayerInputs {
  const float* qkv;    // [T][conv_dim]   x W_qkv (attn_qkv)
  const float* z;      // [T][value_dim]  x W_gate (attn_gate)
  const float* alpha;  // [T][n_v_heads]  x W_alpha (ssm_alpha)
  const float* beta;   // [T][n_v_heads]  x W_beta (ssm_beta)
  int64_t n_tokens;
};
// One sequence's recurrent states for a layer (Backend::gated_delta_net_rows): conv [d_conv-1][conv_dim],
// ssm [n_v_heads][head_k_dim][head_v_dim].
struct GdnSlotState {
  float* conv;
  float* ssm;
};
struct GdnLayerParams {
  const float* conv1d;   // [conv_dim][d_conv]
  const float* dt_bias;  // [n_v_heads]
  const float* a;        // [n_v_heads]  -exp(A_log)
  const float* norm;     // [head_v_dim]
  // The weight type of the output projection that reads out next (F32: none given): a backend may write
  // that product's input form of out in the same launch (OpenCL: out rounded as the CPU rounds activations).
  DType out_type = DType::F32;
};
}  // namespace xpert
