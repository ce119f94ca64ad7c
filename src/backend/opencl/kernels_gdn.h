// OpenCL C of the whole-model backend's Gated DeltaNet mixer (model/gated_delta_net.h has the math and
// the CPU reference): causal conv1d + SiLU, per-head L2 norms of q and k, the decay and beta gates, the
// delta rule in its recurrent form, and the gated RMS norm. Core OpenCL C 1.2.
//
// The delta rule runs one work-group per value head; work-item j owns column j of the head's state
// S [head_k_dim][head_v_dim] (kept in the state buffer: each step reads and writes it once, coalesced
// across the work-group), q_t and k_t of the step sit in local memory.
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kGdnSource = R"CLC(
#define GDN_MAXDK 512

// Work-item c: channel c over every token; the state keeps the last d_conv-1 rows of the window.
kernel void conv1d_silu(global const float* x, int n_tokens, int channels, global const float* w, int d_conv,
                        global float* state, global float* out) {
  const int c = get_global_id(0);
  if (c >= channels) return;
  const int ns = d_conv - 1;
  for (int t = 0; t < n_tokens; ++t) {
    float s = 0.0f;
    for (int j = 0; j < d_conv; ++j) {
      const int r = t + j;
      const float v = r < ns ? state[(long)r * channels + c] : x[(long)(r - ns) * channels + c];
      s += v * w[(long)c * d_conv + j];
    }
    out[(long)t * channels + c] = silu_f(s);
  }
  // Shift in the last rows of the window (state rows then x rows); per channel, so in place is safe.
  for (int r = 0; r < ns; ++r) {
    const int src = n_tokens + r;  // window row
    state[(long)r * channels + c] = src < ns ? state[(long)src * channels + c] : x[(long)(src - ns) * channels + c];
  }
}

// One work-group per row of n (row r at x + (r / per_token) * stride + (r % per_token) * n):
// x / sqrt(sum x^2 + eps), in place.
kernel void l2_norm(global float* x, int n, int per_token, long stride, float eps) {
  local float buf[RED_WG];
  const long r = get_group_id(0);
  global float* xr = x + (r / per_token) * stride + (r % per_token) * n;
  float s = 0.0f;
  for (int i = get_local_id(0); i < n; i += RED_WG) s += xr[i] * xr[i];
  s = wg_sum(s, buf);
  const float inv = 1.0f / sqrt(s + eps);
  for (int i = get_local_id(0); i < n; i += RED_WG) xr[i] *= inv;
}

// g = softplus(alpha + dt_bias) * a (log decay), beta = sigmoid(beta), per (token, value head).
kernel void gdn_gates(global const float* alpha, global const float* beta_in, global const float* dt_bias,
                      global const float* a, int n_v_heads, global float* g, global float* beta, long total) {
  const long i = get_global_id(0);
  if (i >= total) return;
  const int h = i % n_v_heads;
  const float x = alpha[i] + dt_bias[h];
  const float sp = x > 20.0f ? x : log(1.0f + exp(x));
  g[i] = sp * a[h];
  beta[i] = sigmoid_f(beta_in[i]);
}

// Work-group h (value head), work-items j < head_v_dim (columns, looping when the group is narrower).
kernel void delta_rule_recurrent(global const float* q, global const float* k, global const float* v,
                                 long qk_stride, long v_stride, global const float* g, global const float* beta,
                                 global float* state, global float* out, int n_tokens, int n_k_heads,
                                 int n_v_heads, int dk, int dv) {
  local float qs[GDN_MAXDK], ks[GDN_MAXDK];
  const int h = get_group_id(0), kh = h % n_k_heads, lid = get_local_id(0), wg = get_local_size(0);
  global float* S = state + (long)h * dk * dv;
  const float scale = 1.0f / sqrt((float)dk);
  for (int t = 0; t < n_tokens; ++t) {
    for (int i = lid; i < dk; i += wg) {
      qs[i] = q[t * qk_stride + kh * dk + i];
      ks[i] = k[t * qk_stride + kh * dk + i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const float decay = exp(g[(long)t * n_v_heads + h]), b = beta[(long)t * n_v_heads + h];
    for (int j = lid; j < dv; j += wg) {
      float delta = 0.0f;
      for (int i = 0; i < dk; ++i) {
        const float s = S[(long)i * dv + j] * decay;
        S[(long)i * dv + j] = s;
        delta += ks[i] * s;
      }
      delta = (v[t * v_stride + (long)h * dv + j] - delta) * b;
      float o = 0.0f;
      for (int i = 0; i < dk; ++i) {
        const float s = S[(long)i * dv + j] + ks[i] * delta;
        S[(long)i * dv + j] = s;
        o += qs[i] * s;
      }
      out[((long)t * n_v_heads + h) * dv + j] = o * scale;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}

// Per row of n (one value head of one token): out = rmsnorm(out) * w * silu(z), in place.
kernel void gated_rmsnorm(global float* out, global const float* w, global const float* z, int n, float eps) {
  local float buf[RED_WG];
  const long r = get_group_id(0);
  global float* o = out + r * n;
  global const float* zr = z + r * n;
  float s = 0.0f;
  for (int i = get_local_id(0); i < n; i += RED_WG) s += o[i] * o[i];
  s = wg_sum(s, buf);
  const float inv = 1.0f / sqrt(s / (float)n + eps);
  for (int i = get_local_id(0); i < n; i += RED_WG) o[i] = (o[i] * inv) * w[i] * silu_f(zr[i]);
}
)CLC";

}  // namespace xpert::opencl
