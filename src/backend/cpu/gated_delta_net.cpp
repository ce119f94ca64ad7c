#include "backend/cpu/gated_delta_net.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"

namespace xpert::cpu {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // 8 partial sums so the compiler can vectorize the reduction
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y += a * x
void axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }  // ggml's threshold

}  // namespace

// The plain recurrence, one value head per task. S is [dk][dv] so every step is a row axpy.
void delta_rule_recurrent(const GdnShape& s, const DeltaRuleArgs& a, ThreadPool& pool) {
  const int64_t Hk = s.n_k_heads, Hv = s.n_v_heads, dk = s.head_k_dim, dv = s.head_v_dim;
  const int64_t qk_stride = a.qk_stride ? a.qk_stride : Hk * dk, v_stride = a.v_stride ? a.v_stride : Hv * dv;
  const float scale = 1.0f / std::sqrt((float)dk);
  pool.parallel_for(Hv, [&](int64_t h0, int64_t h1) {
    std::vector<float> delta(dv);
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h % Hk;
      float* S = a.state + h * dk * dv;
      for (int64_t t = 0; t < a.n_tokens; ++t) {
        const float* q = a.q + t * qk_stride + kh * dk;
        const float* k = a.k + t * qk_stride + kh * dk;
        const float* v = a.v + t * v_stride + h * dv;
        const float decay = std::exp(a.g[t * Hv + h]), beta = a.beta[t * Hv + h];
        // S *= decay; delta = beta (v - S^T k)
        std::fill(delta.begin(), delta.end(), 0.0f);
        for (int64_t i = 0; i < dk; ++i) {
          float* row = S + i * dv;
          for (int64_t j = 0; j < dv; ++j) row[j] *= decay;
          axpy(delta.data(), k[i], row, dv);
        }
        for (int64_t j = 0; j < dv; ++j) delta[j] = (v[j] - delta[j]) * beta;
        // S += k delta^T; o = S^T q * scale
        float* o = a.out + (t * Hv + h) * dv;
        std::fill(o, o + dv, 0.0f);
        for (int64_t i = 0; i < dk; ++i) {
          float* row = S + i * dv;
          axpy(row, k[i], delta.data(), dv);
          axpy(o, q[i], row, dv);
        }
        for (int64_t j = 0; j < dv; ++j) o[j] *= scale;
      }
    }
  });
}

// The chunked form (fla's WY representation, as transformers' torch_chunk_gated_delta_rule). Within a
// chunk of L tokens with cumulative log decay G_i:
//   A[i][j] = -beta_i (k_i . k_j) exp(G_i - G_j) for j < i;  T = (I - A')^-1 by forward substitution
//   u = T (beta v),  w = T (beta exp(G) k)
//   v_new = u - w S;  o_i = scale (exp(G_i) q_i S + sum_{j<=i} (q_i . k_j) exp(G_i - G_j) v_new_j)
//   S = exp(G_last) S + sum_j exp(G_last - G_j) k_j v_new_j^T
void delta_rule_chunked(const GdnShape& s, const DeltaRuleArgs& a, ThreadPool& pool, int64_t chunk) {
  const int64_t Hk = s.n_k_heads, Hv = s.n_v_heads, dk = s.head_k_dim, dv = s.head_v_dim;
  const int64_t qk_stride = a.qk_stride ? a.qk_stride : Hk * dk, v_stride = a.v_stride ? a.v_stride : Hv * dv;
  const float scale = 1.0f / std::sqrt((float)dk);
  const int64_t C = std::max<int64_t>(1, chunk);
  pool.parallel_for(Hv, [&](int64_t h0, int64_t h1) {
    std::vector<float> G(C), B(C), A(C * C), QK(C * C), old(C), u(C * dv), w(C * dk), vnew(C * dv), ed(C);
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h % Hk;
      float* S = a.state + h * dk * dv;
      auto q_row = [&](int64_t t) { return a.q + t * qk_stride + kh * dk; };
      auto k_row = [&](int64_t t) { return a.k + t * qk_stride + kh * dk; };
      auto v_row = [&](int64_t t) { return a.v + t * v_stride + h * dv; };
      for (int64_t t0 = 0; t0 < a.n_tokens; t0 += C) {
        const int64_t L = std::min(C, a.n_tokens - t0);
        float cum = 0.0f;
        for (int64_t i = 0; i < L; ++i) {
          cum += a.g[(t0 + i) * Hv + h];
          G[i] = cum;
          B[i] = a.beta[(t0 + i) * Hv + h];
        }
        // A (strictly lower) and the decayed q.k scores (lower, with the diagonal).
        for (int64_t i = 0; i < L; ++i) {
          const float* ki = k_row(t0 + i);
          const float* qi = q_row(t0 + i);
          for (int64_t j = 0; j <= i; ++j) {
            const float* kj = k_row(t0 + j);
            const float d = std::exp(G[i] - G[j]);
            if (j < i) A[i * C + j] = -B[i] * dot(ki, kj, dk) * d;
            QK[i * C + j] = dot(qi, kj, dk) * d;
          }
        }
        // Forward substitution, row by row: row i += sum_m old_row_i[m] * row_m (rows m < i final).
        for (int64_t i = 1; i < L; ++i) {
          std::memcpy(old.data(), &A[i * C], i * sizeof(float));
          for (int64_t m = 1; m < i; ++m) {
            const float c = old[m];
            for (int64_t j = 0; j < m; ++j) A[i * C + j] += c * A[m * C + j];
          }
        }
        // u = T (beta v), w = T (beta exp(G) k), T = A + I.
        for (int64_t i = 0; i < L; ++i) {
          float* ui = &u[i * dv];
          float* wi = &w[i * dk];
          std::fill(ui, ui + dv, 0.0f);
          std::fill(wi, wi + dk, 0.0f);
          for (int64_t j = 0; j <= i; ++j) {
            const float t = j == i ? 1.0f : A[i * C + j];
            axpy(ui, t * B[j], v_row(t0 + j), dv);
            axpy(wi, t * B[j] * std::exp(G[j]), k_row(t0 + j), dk);
          }
        }
        // v_new = u - w S; the inter-chunk part of o = exp(G) q S.
        for (int64_t i = 0; i < L; ++i) {
          float* vn = &vnew[i * dv];
          float* o = a.out + ((t0 + i) * Hv + h) * dv;
          std::memcpy(vn, &u[i * dv], dv * sizeof(float));
          std::fill(o, o + dv, 0.0f);
          const float* wi = &w[i * dk];
          const float* qi = q_row(t0 + i);
          const float eg = std::exp(G[i]);
          for (int64_t r = 0; r < dk; ++r) {
            axpy(vn, -wi[r], S + r * dv, dv);
            axpy(o, qi[r] * eg, S + r * dv, dv);
          }
        }
        // The intra-chunk part, and the scale.
        for (int64_t i = 0; i < L; ++i) {
          float* o = a.out + ((t0 + i) * Hv + h) * dv;
          for (int64_t j = 0; j <= i; ++j) axpy(o, QK[i * C + j], &vnew[j * dv], dv);
          for (int64_t j = 0; j < dv; ++j) o[j] *= scale;
        }
        // The state at the chunk's end.
        const float e_last = std::exp(G[L - 1]);
        for (int64_t j = 0; j < L; ++j) ed[j] = std::exp(G[L - 1] - G[j]);
        for (int64_t r = 0; r < dk; ++r) {
          float* row = S + r * dv;
          for (int64_t c = 0; c < dv; ++c) row[c] *= e_last;
          for (int64_t j = 0; j < L; ++j) axpy(row, k_row(t0 + j)[r] * ed[j], &vnew[j * dv], dv);
        }
      }
    }
  });
}

void causal_conv1d_silu(const float* x, int64_t n_tokens, int64_t channels, const float* w, int64_t d_conv,
                        float* conv_state, float* out) {
  const int64_t K = d_conv, C = channels, T = n_tokens, ns = K - 1;
  std::vector<float> wt(K * C);  // [K][C], so the inner loop runs over channels
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) wt[j * C + c] = w[c * K + j];
  auto window_row = [&](int64_t r) { return r < ns ? conv_state + r * C : x + (r - ns) * C; };
  for (int64_t t = 0; t < T; ++t) {
    float* o = out + t * C;
    std::fill(o, o + C, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const float* src = window_row(t + j);
      const float* wj = &wt[j * C];
      for (int64_t c = 0; c < C; ++c) o[c] += src[c] * wj[c];
    }
    for (int64_t c = 0; c < C; ++c) o[c] = silu(o[c]);
  }
  // Keep the last d_conv-1 rows of the window (state rows then x rows).
  if (T >= ns) {
    std::memcpy(conv_state, x + (T - ns) * C, ns * C * sizeof(float));
  } else {
    std::memmove(conv_state, conv_state + T * C, (ns - T) * C * sizeof(float));
    std::memcpy(conv_state + (ns - T) * C, x, T * C * sizeof(float));
  }
}

void l2_norm_rows(float* x, int64_t rows, int64_t n, float eps) {
  // llama.cpp: rms_norm(x, eps/n) / sqrt(n) = x / sqrt(sum x^2 + eps), the sum in double.
  rmsnorm(x, nullptr, x, rows, n, eps / (float)n);
  scale(x, 1.0f / std::sqrt((float)n), rows * n);
}

void gated_delta_net(const GdnShape& s, const GdnLayerParams& p, const GdnLayerInputs& in, float* conv_state,
                     float* ssm_state, float* out, GdnScratch& sc, ThreadPool& pool, DeltaRuleForm form) {
  const int64_t T = in.n_tokens, Hv = s.n_v_heads, dv = s.head_v_dim, CD = s.conv_dim();
  sc.conv_out.resize(T * CD);
  sc.g.resize(T * Hv);
  sc.beta.resize(T * Hv);
  causal_conv1d_silu(in.qkv, T, CD, p.conv1d, s.d_conv, conv_state, sc.conv_out.data());
  // q and k are the first 2 * key_dim channels of each row: normalize them per head in place.
  for (int64_t t = 0; t < T; ++t)
    l2_norm_rows(sc.conv_out.data() + t * CD, 2 * s.n_k_heads, s.head_k_dim, s.eps);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      sc.g[t * Hv + h] = softplus(in.alpha[t * Hv + h] + p.dt_bias[h]) * p.a[h];
      sc.beta[t * Hv + h] = sigmoid(in.beta[t * Hv + h]);
    }
  const DeltaRuleArgs a{.q = sc.conv_out.data(),
                        .k = sc.conv_out.data() + s.key_dim(),
                        .v = sc.conv_out.data() + 2 * s.key_dim(),
                        .g = sc.g.data(),
                        .beta = sc.beta.data(),
                        .state = ssm_state,
                        .out = out,
                        .n_tokens = T,
                        .qk_stride = CD,
                        .v_stride = CD};
  if (form == DeltaRuleForm::automatic)
    form = T >= kChunkedMinTokens ? DeltaRuleForm::chunked : DeltaRuleForm::recurrent;
  if (form == DeltaRuleForm::chunked)
    delta_rule_chunked(s, a, pool);
  else
    delta_rule_recurrent(s, a, pool);
  // Gated RMS norm per head: rmsnorm(o) * w * silu(z).
  rmsnorm(out, p.norm, out, T * Hv, dv, s.eps);
  for (int64_t i = 0; i < T * Hv * dv; ++i) out[i] *= silu(in.z[i]);
}

}  // namespace xpert::cpu
