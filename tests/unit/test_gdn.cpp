// Gated DeltaNet: the recurrent and chunked delta-rule forms against a double-precision scalar
// reference and each other, on random data of real shapes, with the state carried across calls; the
// causal conv with its carried state.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "backend/cpu/gated_delta_net.h"

namespace xpert {
namespace {
using namespace xpert::cpu;  // the reference kernels

struct Inputs {
  std::vector<float> q, k, v, g, beta;
};

Inputs random_inputs(const GdnShape& s, int64_t T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  Inputs in;
  in.q.resize(T * s.key_dim());
  in.k.resize(T * s.key_dim());
  in.v.resize(T * s.value_dim());
  in.g.resize(T * s.n_v_heads);
  in.beta.resize(T * s.n_v_heads);
  for (auto& x : in.q) x = n01(rng);
  for (auto& x : in.k) x = n01(rng);
  for (auto& x : in.v) x = n01(rng);
  // Decays as a trained model makes them (softplus(alpha + dt_bias) * -exp(A_log)): -0.02 to -0.15 a token,
  // except every fourth head's, which are mostly near 0 with some strong ones. Slow decays carry the state
  // from chunk to chunk, so an error in it shows in the next chunk (fast ones erased it within a chunk).
  for (size_t i = 0; i < in.g.size(); ++i)
    in.g[i] = i % s.n_v_heads % 4 == 3
                  ? -std::log1p(std::exp(n01(rng) * 2.0f - 1.0f)) * (0.1f + 4.0f * u01(rng) * u01(rng))
                  : -(0.02f + 0.13f * u01(rng));
  for (auto& x : in.beta) x = 1.0f / (1.0f + std::exp(-n01(rng)));
  l2_norm_rows(in.q.data(), T * s.n_k_heads, s.head_k_dim, 1e-6f);
  l2_norm_rows(in.k.data(), T * s.n_k_heads, s.head_k_dim, 1e-6f);
  return in;
}

// The recurrence as transformers' torch_recurrent_gated_delta_rule writes it, in double.
void reference(const GdnShape& s, const Inputs& in, int64_t T, std::vector<double>& S,
               std::vector<double>& out) {
  const int64_t Hk = s.n_k_heads, Hv = s.n_v_heads, dk = s.head_k_dim, dv = s.head_v_dim;
  out.assign(T * Hv * dv, 0.0);
  for (int64_t h = 0; h < Hv; ++h) {
    double* st = &S[h * dk * dv];
    const int64_t kh = h % Hk;
    for (int64_t t = 0; t < T; ++t) {
      const float* q = &in.q[(t * Hk + kh) * dk];
      const float* k = &in.k[(t * Hk + kh) * dk];
      const float* v = &in.v[(t * Hv + h) * dv];
      const double decay = std::exp((double)in.g[t * Hv + h]), beta = in.beta[t * Hv + h];
      for (int64_t i = 0; i < dk * dv; ++i) st[i] *= decay;
      for (int64_t j = 0; j < dv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < dk; ++i) kv += st[i * dv + j] * k[i];
        const double d = (v[j] - kv) * beta;
        for (int64_t i = 0; i < dk; ++i) st[i * dv + j] += k[i] * d;
      }
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += st[i * dv + j] * q[i];
        out[(t * Hv + h) * dv + j] = o / std::sqrt((double)dk);
      }
    }
  }
}

DeltaRuleArgs args_at(const GdnShape& s, const Inputs& in, int64_t t0, int64_t n, float* state, float* out) {
  return {.q = in.q.data() + t0 * s.key_dim(),
          .k = in.k.data() + t0 * s.key_dim(),
          .v = in.v.data() + t0 * s.value_dim(),
          .g = in.g.data() + t0 * s.n_v_heads,
          .beta = in.beta.data() + t0 * s.n_v_heads,
          .state = state,
          .out = out + t0 * s.value_dim(),
          .n_tokens = n};
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

template <class A, class B>
double max_diff(const A& a, const B& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs((double)a[i] - (double)b[i]));
  return m;
}

struct Case {
  int64_t n_k_heads, n_v_heads, dim, T;
};

class GdnForms : public ::testing::TestWithParam<Case> {};

TEST_P(GdnForms, RecurrentAndChunkedMatchReference) {
  const Case c = GetParam();
  const GdnShape s{
      .n_k_heads = c.n_k_heads, .n_v_heads = c.n_v_heads, .head_k_dim = c.dim, .head_v_dim = c.dim};
  const Inputs in = random_inputs(s, c.T, 1234 + (uint32_t)c.T);
  ThreadPool pool(2);
  // A non-zero start state, as after an earlier prompt.
  std::mt19937 rng(7);
  std::normal_distribution<float> n01(0.0f, 0.3f);
  std::vector<float> s0(s.ssm_state_size());
  for (auto& x : s0) x = n01(rng);

  std::vector<double> ref_state(s0.begin(), s0.end()), ref_out;
  reference(s, in, c.T, ref_state, ref_out);

  std::vector<float> st_r = s0, st_c = s0, out_r(c.T * s.value_dim()), out_c(c.T * s.value_dim());
  delta_rule_recurrent(s, args_at(s, in, 0, c.T, st_r.data(), out_r.data()), pool);
  delta_rule_chunked(s, args_at(s, in, 0, c.T, st_c.data(), out_c.data()), pool);

  const double out_scale = std::max(1.0, max_abs(ref_out)), st_scale = std::max(1.0, max_abs(ref_state));
  EXPECT_LT(max_diff(out_r, ref_out), 2e-5 * out_scale);
  EXPECT_LT(max_diff(out_c, ref_out), 2e-5 * out_scale);
  EXPECT_LT(max_diff(st_r, ref_state), 2e-5 * st_scale);
  EXPECT_LT(max_diff(st_c, ref_state), 2e-5 * st_scale);
  EXPECT_LT(max_diff(out_r, out_c), 2e-5 * out_scale);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GdnForms,
                         ::testing::Values(Case{16, 16, 128, 1}, Case{16, 16, 128, 7}, Case{16, 16, 128, 64},
                                           Case{16, 16, 128, 200}, Case{8, 16, 128, 65}, Case{2, 4, 32, 130}),
                         [](const auto& info) {
                           return "k" + std::to_string(info.param.n_k_heads) + "v" +
                                  std::to_string(info.param.n_v_heads) + "d" +
                                  std::to_string(info.param.dim) + "T" + std::to_string(info.param.T);
                         });

// Prefill 100 then 37 more == 137 at once == 137 one by one; and the chunk size does not matter.
TEST(GdnForms, StateCarriesAcrossCalls) {
  const GdnShape s{.n_k_heads = 16, .n_v_heads = 16, .head_k_dim = 128, .head_v_dim = 128};
  const int64_t T = 137;
  const Inputs in = random_inputs(s, T, 99);
  ThreadPool pool(2);
  const size_t n_out = T * s.value_dim();
  std::vector<float> st_all(s.ssm_state_size()), st_split(s.ssm_state_size()), st_one(s.ssm_state_size()),
      st_c16(s.ssm_state_size());
  std::vector<float> out_all(n_out), out_split(n_out), out_one(n_out), out_c16(n_out);
  delta_rule_chunked(s, args_at(s, in, 0, T, st_all.data(), out_all.data()), pool);
  delta_rule_chunked(s, args_at(s, in, 0, 100, st_split.data(), out_split.data()), pool);
  delta_rule_chunked(s, args_at(s, in, 100, 37, st_split.data(), out_split.data()), pool);
  for (int64_t t = 0; t < T; ++t)
    delta_rule_recurrent(s, args_at(s, in, t, 1, st_one.data(), out_one.data()), pool);
  delta_rule_chunked(s, args_at(s, in, 0, T, st_c16.data(), out_c16.data()), pool, 16);

  std::vector<double> ref_state(s.ssm_state_size(), 0.0), ref_out;
  reference(s, in, T, ref_state, ref_out);
  const double tol_out = 2e-5 * std::max(1.0, max_abs(ref_out)),
               tol_st = 2e-5 * std::max(1.0, max_abs(ref_state));
  for (const auto* o : {&out_all, &out_split, &out_one, &out_c16}) EXPECT_LT(max_diff(*o, ref_out), tol_out);
  for (const auto* st : {&st_all, &st_split, &st_one, &st_c16}) EXPECT_LT(max_diff(*st, ref_state), tol_st);
  EXPECT_LT(max_diff(out_all, out_split), tol_out);
  EXPECT_LT(max_diff(out_all, out_one), tol_out);
}

TEST(GdnConv, StateCarriesAcrossCalls) {
  const int64_t C = 40, K = 4, T = 11;
  std::mt19937 rng(3);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> x(T * C), w(C * K);
  for (auto& v : x) v = n01(rng);
  for (auto& v : w) v = n01(rng);
  // Reference: zero history, out[t][c] = silu(sum_j x[t - (K-1) + j][c] w[c][j]).
  std::vector<float> ref(T * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t r = t - (K - 1) + j;
        if (r >= 0) acc += x[r * C + c] * w[c * K + j];
      }
      ref[t * C + c] = acc / (1.0f + std::exp(-acc));
    }
  for (int64_t split : {0, 1, 2, 5, 10}) {
    std::vector<float> state((K - 1) * C, 0.0f), out(T * C);
    if (split > 0) causal_conv1d_silu(x.data(), split, C, w.data(), K, state.data(), out.data());
    causal_conv1d_silu(x.data() + split * C, T - split, C, w.data(), K, state.data(), out.data() + split * C);
    EXPECT_LT(max_diff(out, ref), 1e-5) << "split " << split;
    for (int64_t r = 0; r < K - 1; ++r)
      for (int64_t c = 0; c < C; ++c) EXPECT_EQ(state[r * C + c], x[(T - (K - 1) + r) * C + c]);
  }
  // One token at a time.
  std::vector<float> state((K - 1) * C, 0.0f), out(T * C);
  for (int64_t t = 0; t < T; ++t)
    causal_conv1d_silu(x.data() + t * C, 1, C, w.data(), K, state.data(), out.data() + t * C);
  EXPECT_LT(max_diff(out, ref), 1e-5);
}

TEST(GdnNorm, L2NormRows) {
  std::vector<float> x = {3, 4, 0, 0, 0, 0};
  l2_norm_rows(x.data(), 2, 3, 1e-6f);
  EXPECT_NEAR(x[0], 0.6f, 1e-6f);
  EXPECT_NEAR(x[1], 0.8f, 1e-6f);
  EXPECT_EQ(x[3], 0.0f);  // zero rows stay zero (eps keeps the divisor positive)
}

}  // namespace
}  // namespace xpert
